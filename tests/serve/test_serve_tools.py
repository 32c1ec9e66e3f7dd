"""Qwen/Hermes tool-call parsing: whole text and streamed deltas give the same content and calls."""

from __future__ import annotations

import json
import random

import pytest

from localflash.serve.tools import ToolCallStream, parse_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'

CASES = [
    # text, expected content, expected [(name, arguments)]
    ("Just text, no call.", "Just text, no call.", []),
    (CALL, "", [("get_weather", {"city": "Paris", "unit": "C"})]),
    ("Let me check.\n\n" + CALL, "Let me check.", [("get_weather", {"city": "Paris", "unit": "C"})]),
    (CALL + "\n" + CALL.replace("Paris", "Oslo"), "", [("get_weather", {"city": "Paris", "unit": "C"}), ("get_weather", {"city": "Oslo", "unit": "C"})]),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "", [("f", {"x": 1})]),  # arguments as a JSON string
    ('<tool_call>{"name": "f", "parameters": {"x": 2}}</tool_call>', "", [("f", {"x": 2})]),
    ('<tool_call>{"name": "f"}</tool_call> done', "done", [("f", {})]),
    ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),  # a broken block stays text
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),  # no name
    ('<tool_call>{"name": "f", "arguments": {"x": 1}', '<tool_call>{"name": "f", "arguments": {"x": 1}', []),  # unclosed
    ("a < b and <tool", "a < b and <tool", []),  # a partial tag at the end is text after all
    ("price: 5 <tool_", "price: 5 <tool_", []),
    ("Ünïcödé ✓ " + CALL, "Ünïcödé ✓", [("get_weather", {"city": "Paris", "unit": "C"})]),
]


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_whole_text_parse(text, content, calls):
    got_content, got_calls = parse_tool_calls(text)
    assert got_content == content
    assert _calls(got_calls) == calls


@pytest.mark.parametrize("text,content,calls", CASES)
def test_streamed_deltas_match_whole_text_at_any_split(text, content, calls):
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 8)))) if len(text) > 1 else []
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        s = ToolCallStream()
        out, got = [], []
        for p in pieces:
            c, new = s.feed(p)
            out.append(c)
            got += new
        tail, _ = s.flush()
        out.append(tail)
        assert "".join(out) == content, pieces
        assert _calls(got) == calls
    one_char = ToolCallStream()
    streamed = "".join(one_char.feed(ch)[0] for ch in text) + one_char.flush()[0]
    assert streamed == content


def test_a_call_is_reported_once_its_block_closes():
    s = ToolCallStream()
    assert s.feed("Sure. <tool_call>\n{\"name\": \"f\", ") == ("Sure.", [])
    content, calls = s.feed('"arguments": {}}\n</tool_call>')
    assert content == "" and [c.name for c in calls] == ["f"]
    assert calls[0].id.startswith("call_") and calls[0].to_openai(0)["index"] == 0
