"""Tool calls in model output: Qwen/Hermes ``<tool_call>{json}</tool_call>`` -> OpenAI ``tool_calls``.

Qwen2.5/Qwen3, Hermes and many fine-tunes write a call as a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` tags. The parser
is one state machine fed with text deltas: text outside the tags is content
(whitespace next to a call is dropped), a block that parses becomes a call, a
block that does not stays in the content as written. The whole-text parse is
the same machine fed once, so streamed and non-streamed replies agree.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

START, END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self):
        self.id = self.id or "call_" + secrets.token_hex(12)

    def to_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def parse_call(block: str) -> ToolCall | None:
    """One block's text (between the tags) -> a call, or None when it is not ``{"name", "arguments"}``."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallStream:
    """Feed text deltas; get back (content delta, calls completed by this delta)."""

    def __init__(self):
        self.buf = ""  # text not yet decided
        self.inside = False  # between <tool_call> and </tool_call>
        self.after_call = False  # drop whitespace that follows a call
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buf += text
        out, new = [], []
        while True:
            if self.inside:
                end = self.buf.find(END)
                if end < 0:
                    break
                block, self.buf = self.buf[:end], self.buf[end + len(END):]
                self.inside = False
                call = parse_call(block.strip())
                if call is None:
                    out.append(START + block + END)
                else:
                    new.append(call)
                    self.after_call = True
                continue
            if self.after_call:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self.after_call = False
            start = self.buf.find(START)
            if start >= 0:
                out.append(self.buf[:start].rstrip())
                self.buf = self.buf[start + len(START):]
                self.inside = True
                continue
            # hold back a tail that may begin the tag, and trailing whitespace that may precede one
            keep = _partial_tag(self.buf)
            body = self.buf[: len(self.buf) - keep]
            ws = len(body) - len(body.rstrip())
            out.append(body[: len(body) - ws])
            self.buf = self.buf[len(body) - ws:]
            break
        self.calls += new
        return "".join(out), new

    def flush(self) -> tuple[str, list[ToolCall]]:
        """End of the text: whatever is held back is content (an unclosed block as written)."""
        rest = (START if self.inside else "") + self.buf
        self.buf, self.inside = "", False
        if self.after_call:
            rest = rest.lstrip()
        return rest, []


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Whole text -> (content, calls)."""
    s = ToolCallStream()
    content, calls = s.feed(text)
    tail, _ = s.flush()
    return content + tail, calls


def _partial_tag(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of START."""
    for n in range(min(len(START) - 1, len(text)), 0, -1):
        if START.startswith(text[-n:]):
            return n
    return 0
