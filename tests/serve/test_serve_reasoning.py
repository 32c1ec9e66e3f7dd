"""`localflash serve` on a thinking template (Qwen3.5's, on the tiny model), through the real `openai` client.

The reply's thinking comes in reasoning_content and the rest in content, whole and
streamed alike, and both split the raw text (reasoning_format none) where </think>
is; enable_thinking false (per request, or --no-think for the server) leaves no
thinking block; the detected tool-call format shows on the startup screen; tool_choice
required / named forces a call of the tool.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the dev extra installs openai")

from localflash.testing.serve import LiveServer  # noqa: E402

QWEN35 = Path(__file__).parent / "data" / "templates" / "qwen3.5-4b.jinja"
MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]
# an enum value: the random tiny model's free text would run to max_tokens inside the forced <parameter> block
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def thinking_target(tiny_target, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("think") / "tiny-qwen35.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(tiny_target), str(out),
                    "--chat-template-file", str(QWEN35), "--force"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def server(thinking_target, tmp_path_factory):
    s = LiveServer("-t", "1", "-m", thinking_target, "--spec", "none", "-c", "2048", log=tmp_path_factory.mktemp("s") / "log", timeout=120)
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.text()


def whole(s, **kw):
    r = s.client().chat.completions.create(model=s.model, messages=MESSAGES, temperature=0, max_tokens=40, **kw)
    m = r.choices[0].message
    return m.content or "", (m.model_extra or {}).get("reasoning_content")


def streamed(s, **kw):
    content, reasoning = [], []
    for ch in s.client().chat.completions.create(model=s.model, messages=MESSAGES, temperature=0, max_tokens=40, stream=True, **kw):
        for c in ch.choices:
            content.append(c.delta.content or "")
            reasoning.append((c.delta.model_extra or {}).get("reasoning_content") or "")
    return "".join(content), "".join(reasoning) or None


def split(raw: str) -> tuple[str, str | None]:
    """What the raw text says, split by hand: the prompt opened <think>, so it thinks up to </think>."""
    if "</think>" in raw:
        think, answer = raw.split("</think>", 1)
        return answer.lstrip(), think.strip() or None
    return "", raw.strip() or None


def test_thinking_goes_to_reasoning_content_whole_and_streamed(server):
    raw, none = whole(server, extra_body={"reasoning_format": "none"})
    assert none is None and raw  # reasoning_format none: the text as the model wrote it
    assert whole(server) == split(raw) == streamed(server)
    assert split(raw)[1]  # there was thinking to move


def test_enable_thinking_false_leaves_no_thinking_block(server):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    raw, _ = whole(server, extra_body={**off, "reasoning_format": "none"})
    content, reasoning = whole(server, extra_body=off)
    assert not raw.startswith("<think>")  # the template closed the block; the model did not open one
    assert reasoning is None and content == raw
    assert streamed(server, extra_body=off) == (content, reasoning)


def test_the_startup_screen_names_the_detected_tool_call_format(server):
    assert "tools    qwen3_xml calls (from the chat template); thinking to reasoning_content" in server.text()


def test_forced_tool_choice_is_a_call_of_the_named_tool_after_no_thinking_block(server):
    """required / named: the grammar forces the call in the template's format (qwen3_xml); the template would open
    <think>, so the forced call turns thinking off (the request did not ask for it) and the call parses."""
    client = server.client()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=64, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather" and r.choices[0].finish_reason in ("tool_calls", "length"), r  # parallel calls may run on to max_tokens
        assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model=server.model, messages=MESSAGES, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})


def test_no_think_makes_thinking_off_the_server_default(thinking_target, server, tmp_path):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    want = whole(server, extra_body=off)
    s = LiveServer("-t", "1", "-m", thinking_target, "--spec", "none", "-c", "2048", "--no-think", "--tool-format", "hermes",
                   log=tmp_path / "log", timeout=120)
    try:
        assert whole(s) == want
        assert "tools    hermes calls (--tool-format); thinking to reasoning_content, off by default" in s.text()
    finally:
        assert s.stop() == 0


def test_an_unknown_tool_format_is_one_line_and_a_nonzero_exit(thinking_target):
    r = subprocess.run([sys.executable, "-m", "localflash.cli", "serve", "-m", str(thinking_target), "--tool-format", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown tool-call format 'nope'" in r.stderr and "Traceback" not in r.stderr
