"""Thinking out of the reply: <think>…</think> -> reasoning_content, whole and in deltas of every size alike."""

from __future__ import annotations

import pytest

from localflash.serve.assistant import ChatStyle, ReplyOptions, ReplyPlan
from localflash.serve.reasoning import ReasoningSplit
from localflash.serve.toolcalls import get_format

from tests.serve.toolcheck import TEMPLATES, assemble, reply_deltas

CASES = [
    # opened by the prompt, text, reasoning, content
    (False, "<think>\nFirst, plan.\n</think>\n\nThe answer.", "First, plan.", "The answer."),
    (True, "First, plan.\nThen act.\n</think>\n\nThe answer.", "First, plan.\nThen act.", "The answer."),
    (True, "\n</think>\n\nNo thinking.", "", "No thinking."),  # enable_thinking false as Qwen3.5 writes it
    (False, "  <think>x</think>y", "x", "y"),
    (False, "Plain answer <think> later is content.", "", "Plain answer <think> later is content."),
    (False, "<thi", "", "<thi"),
    (False, "<think>\nStill thinking when max_tokens hit", "Still thinking when max_tokens hit", ""),
    (True, "Cut in the tag </thi", "Cut in the tag </thi", ""),
    (False, "", "", ""),
    (True, "Ünï ✓\n</think>ok", "Ünï ✓", "ok"),
]


@pytest.mark.parametrize("opened,text,reasoning,content", CASES)
def test_thinking_goes_to_reasoning_whole_and_at_every_delta_size(opened, text, reasoning, content):
    for size in range(1, len(text) + 2):
        split = ReasoningSplit(opened)
        got_r, got_c = [], []
        for i in range(0, len(text), size):
            r, c = split.feed(text[i:i + size])
            got_r.append(r)
            got_c.append(c)
        r, c = split.flush()
        assert ("".join(got_r) + r, "".join(got_c) + c) == (reasoning, content), size


class Info:
    def __init__(self, name: str):
        self.chat_template = (TEMPLATES / name).read_text(encoding="utf-8")
        self.thinking = "enable_thinking" in self.chat_template


@pytest.mark.parametrize("name,thinks,opens", [
    ("qwen3.5-4b.jinja", True, {None: True, True: True, False: False}),
    ("deepseek-r1-distill-qwen-32b.jinja", True, {None: False, True: True, False: False}),  # llama.cpp's copy: off unless enabled
    ("qwen2.5-7b-instruct.jinja", False, {}),
    ("qwen3-coder.jinja", False, {}),
])
def test_the_template_says_whether_the_prompt_opens_the_thinking_block(name, thinks, opens):
    style = ChatStyle(Info(name))
    assert style.thinks == thinks
    assert {k: style.opens_thinking(k) for k in opens} == opens


def test_reasoning_then_a_qwen_xml_call_in_one_streamed_reply():
    text = ("I should look it up.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "</function>\n</tool_call>")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    plan = ReplyPlan(get_format("qwen3_xml"), tools, True)
    for size in range(1, len(text) + 1):
        content, reasoning, calls = assemble(reply_deltas(plan, text, size))
        assert (content, reasoning) == ("", "I should look it up.")
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city": "Paris"}')]


def test_reasoning_format_none_keeps_the_thinking_in_content():
    style = ChatStyle(Info("qwen3.5-4b.jinja"), ReplyOptions(reasoning="none"))
    assert style.options.reasoning == "none"
    from localflash.errors import LocalflashError

    with pytest.raises(LocalflashError, match="unknown reasoning format"):
        ReplyOptions(reasoning="sometimes").check()
