"""Shared checks for the tool-call tests: parse whole, parse streamed in deltas of every size, render templates."""

from __future__ import annotations

import json
from pathlib import Path

from localflash.prompt import render_chat
from localflash.serve.assistant import _TemplateOnly
from localflash.serve.replies import ChatReply
from localflash.serve.toolcalls import parse_tool_calls

TEMPLATES = Path(__file__).parent / "data" / "templates"


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def whole(fmt, tools, text):
    content, calls = parse_tool_calls(text, fmt, tools)
    return content, calls_of(calls)


def streamed(fmt, tools, text, size):
    """Feed ``text`` in pieces of ``size`` characters; the content and calls the deltas add up to."""
    s = fmt.stream(tools)
    out, calls = [], []
    for i in range(0, len(text), size):
        c, new = s.feed(text[i:i + size])
        out.append(c)
        calls += new
    c, new = s.flush()
    return "".join(out) + c, calls_of(calls + new)


def every_size_agrees(fmt, tools, text):
    """Streamed in deltas of every size from 1 to len(text), the reply equals the whole-text parse."""
    want = whole(fmt, tools, text)
    for size in range(1, max(2, len(text) + 1)):
        assert streamed(fmt, tools, text, size) == want, size
    return want


def reply_deltas(plan, text, size):
    """What a streamed chat reply sends for ``text`` in deltas of ``size``: content, reasoning, calls as OpenAI assembles them."""
    r = ChatReply("id", "m", plan)
    deltas = []
    for i in range(0, len(text), size):
        deltas += r.feed(text[i:i + size])
    deltas += r.flush()
    return deltas


def assemble(deltas):
    """OpenAI streaming assembly: content and reasoning joined; tool calls by index (id and name first, then arguments)."""
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for t in d.get("tool_calls", []):
            if t["index"] not in calls:
                assert t["id"] and t["function"]["name"], "a call's first delta carries its id and name"
                calls[t["index"]] = {"id": t["id"], "name": t["function"]["name"], "arguments": t["function"]["arguments"]}
            else:
                assert "id" not in t and "name" not in t["function"]
                calls[t["index"]]["arguments"] += t["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls))), "indexes count from 0"
    return content, reasoning, [calls[i] for i in sorted(calls)]


def render(template: str, messages: list[dict], tools=None, add_generation_prompt=True, thinking=None) -> str:
    return render_chat(_TemplateOnly(template), messages, add_generation_prompt=add_generation_prompt, thinking=thinking, tools=tools)
