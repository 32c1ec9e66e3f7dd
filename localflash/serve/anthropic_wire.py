"""Anthropic's Messages API wire format: request bodies to the chat route's arguments, replies to content blocks.

One request path, two wire formats: a ``POST /v1/messages`` body becomes the OpenAI-style
messages and keyword arguments the chat route hands the worker (:func:`messages_request`), and the
session's chunks become Anthropic content blocks (:class:`MessageReply`): ``thinking`` (the text
inside ``<think>…</think>``), ``text`` and ``tool_use`` (the tool-call parser of the chat route).
A streamed reply is the event sequence Anthropic's clients expect; the whole reply is the same
events folded into one message, so both agree.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from localflash.serve.errors import APIError
from localflash.serve.replies import new_id
from localflash.serve.toolcalls import CallStream

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # as localflash.phases (the session's phase tracker) reads them

# HTTP status -> Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error"),
                                       "message": message}}


# -- requests -------------------------------------------------------------------

class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_In):
    type: Literal["text"]
    text: str


class ThinkingBlock(_In):
    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""


class ToolUseBlock(_In):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_In):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list[TextBlock], None] = None
    is_error: bool | None = None


class OtherBlock(_In):
    type: str  # image, document, ...: refused by name (messages_request)


Block = Union[TextBlock, ThinkingBlock, ToolUseBlock, ToolResultBlock, OtherBlock]


class MessageIn(_In):
    role: Literal["user", "assistant"]
    content: Union[str, list[Block]]


class ToolIn(_In):
    name: str = Field(..., min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolChoice(_In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(_In):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class MessagesRequest(_In):
    model: str
    max_tokens: int = Field(..., ge=1)
    messages: list[MessageIn] = Field(..., min_length=1)
    system: Union[str, list[TextBlock], None] = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class CountTokensRequest(_In):
    model: str
    messages: list[MessageIn] = Field(..., min_length=1)
    system: Union[str, list[TextBlock], None] = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(b.text for b in content)


def chat_messages(body: MessagesRequest | CountTokensRequest) -> list[dict]:
    """The conversation as the chat route's OpenAI-style messages: system first, a ``tool_result`` as a ``tool`` message,
    an assistant's ``tool_use`` blocks as its ``tool_calls``; earlier ``thinking`` blocks are left out (templates drop them)."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system)})
    for i, m in enumerate(body.messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        for b in blocks:
            if isinstance(b, OtherBlock):
                raise APIError(400, f"messages.{i}: {b.type} content blocks are not supported here (text, tool_use, tool_result, thinking)",
                               param=f"messages.{i}.content")
            if isinstance(b, ToolResultBlock) and m.role != "user":
                raise APIError(400, f"messages.{i}: tool_result blocks belong in a user message", param=f"messages.{i}.content")
            if isinstance(b, ToolUseBlock) and m.role != "assistant":
                raise APIError(400, f"messages.{i}: tool_use blocks belong in an assistant message", param=f"messages.{i}.content")
        texts = [b.text for b in blocks if isinstance(b, TextBlock)]
        if m.role == "user":
            for b in blocks:
                if isinstance(b, ToolResultBlock):
                    out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _text(b.content)})
            if texts or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append({"role": "user", "content": "\n".join(texts)})
        else:
            msg: dict = {"role": "assistant", "content": "".join(texts)}
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                     for b in blocks if isinstance(b, ToolUseBlock)]
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def chat_tools(body: MessagesRequest | CountTokensRequest) -> list[dict] | None:
    """Tools as the chat route's OpenAI function specs; None without tools or with ``tool_choice`` none."""
    choice = body.tool_choice.type if body.tool_choice is not None else "auto"
    if choice in ("any", "tool") and not body.tools:
        raise APIError(400, f"tool_choice {choice!r} needs tools", param="tool_choice")
    if choice == "tool" and body.tool_choice.name not in {t.name for t in body.tools}:
        raise APIError(400, f"tool_choice names {body.tool_choice.name!r}, which is not in tools", param="tool_choice")
    if not body.tools or choice == "none":
        return None
    return [{"type": "function", "function": {"name": t.name, **({"description": t.description} if t.description else {}),
                                              "parameters": t.input_schema or {"type": "object", "properties": {}}}}
            for t in body.tools]


def thinking_switch(body: MessagesRequest | CountTokensRequest) -> bool | None:
    """``thinking``: enabled -> the template's thinking on, disabled -> off, left out -> the template's default."""
    if body.thinking is None:
        return None
    return body.thinking.type != "disabled"


def messages_request(body: MessagesRequest) -> tuple[list[dict], dict]:
    """A Messages request -> (messages, the LLM's keyword arguments), as :func:`localflash.serve.messages.chat_request` gives them."""
    stop = body.stop_sequences or None
    if stop is not None and (len(stop) > 16 or any(not s for s in stop)):
        raise APIError(400, "stop_sequences takes up to 16 non-empty strings", param="stop_sequences")
    params = dict(max_tokens=body.max_tokens, temperature=body.temperature, top_k=40 if body.top_k is None else body.top_k,
                  top_p=0.95 if body.top_p is None else body.top_p, min_p=0.05, seed=None, stop=stop, draft_max=None,
                  tools=chat_tools(body))
    thinking = thinking_switch(body)
    if thinking is not None:
        params["thinking"] = thinking
    return chat_messages(body), params


# -- replies --------------------------------------------------------------------

class ThinkSplit:
    """Streamed text -> (kind, text) pieces: ``thinking`` inside ``<think>…</think>``, else ``text`` (tags split over pieces held back)."""

    def __init__(self, phase: str = "answer"):
        self.inside = phase == "think"
        self.buf = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out = []
        while True:
            tag = THINK_CLOSE if self.inside else THINK_OPEN
            j = self.buf.find(tag)
            if j < 0:
                break
            out.append(("thinking" if self.inside else "text", self.buf[:j]))
            self.buf = self.buf[j + len(tag):]
            if self.inside:
                self.buf = self.buf.lstrip("\n")  # the newline templates put after </think>
            self.inside = not self.inside
        keep = next((n for n in range(min(len(tag) - 1, len(self.buf)), 0, -1) if tag.startswith(self.buf[-n:])), 0)
        out.append(("thinking" if self.inside else "text", self.buf[: len(self.buf) - keep]))
        self.buf = self.buf[len(self.buf) - keep:]
        return [(k, t) for k, t in out if t]

    def flush(self) -> list[tuple[str, str]]:
        rest, self.buf = self.buf, ""
        return [("thinking" if self.inside else "text", rest)] if rest else []


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "context": "max_tokens", "cancelled": "end_turn"}


class MessageReply:
    """One assistant message as Anthropic events; :meth:`whole` folds the same events into the message body."""

    def __init__(self, model: str, calls: CallStream | None, stop_sequences: list[str] | None = None):
        """``calls``: the served model's tool-call parser for this request's tools (None without tools)."""
        self.id, self.model = new_id("msg"), model
        self.split = ThinkSplit()
        self.calls = calls
        self.stop_sequences = stop_sequences or []
        self.blocks: list[dict] = []  # the message's content blocks so far
        self.open: str | None = None  # the type of the block being streamed
        self.n_calls = 0

    def begin(self, phase: str) -> None:
        """The phase the reply begins in: ``think`` where the template opened the thinking block itself."""
        self.split = ThinkSplit(phase)

    def start(self, last) -> dict:
        return {"type": "message_start", "message": {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                                                     "content": [], "stop_reason": None, "stop_sequence": None,
                                                     "usage": {**self._input(last), "output_tokens": 0}}}

    @staticmethod
    def _input(last) -> dict:
        cached = last.cached_tokens if last is not None else 0
        prompt = last.prompt_tokens if last is not None else 0
        return {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}

    def feed(self, text: str) -> list[dict]:
        """New reply text -> the events it makes."""
        events = []
        for kind, piece in self.split.feed(text):
            events += self._piece(kind, piece)
        return events

    def flush(self) -> list[dict]:
        events = []
        for kind, piece in self.split.flush():
            events += self._piece(kind, piece)
        if self.calls is not None:
            rest, calls = self.calls.flush()
            events += self._text(rest)
            for c in calls:
                events += self._tool_use(c)
        if self.open is not None:
            events += self._stop()
        return events

    def _piece(self, kind: str, piece: str) -> list[dict]:
        if kind == "thinking":
            return self._delta("thinking", {"type": "thinking_delta", "thinking": piece})
        if self.calls is None:
            return self._text(piece)
        content, calls = self.calls.feed(piece)
        events = self._text(content)
        for c in calls:
            events += self._tool_use(c)
        return events

    def _text(self, text: str) -> list[dict]:
        if self.open != "text" and self.blocks and self.blocks[-1]["type"] == "thinking":
            text = text.lstrip()  # the answer after a thinking block begins at its first visible character
        return self._delta("text", {"type": "text_delta", "text": text}) if text else []

    def _delta(self, kind: str, delta: dict) -> list[dict]:
        events = []
        if self.open != kind:
            if self.open is not None:
                events += self._stop()
            block = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
            self.blocks.append(dict(block))
            self.open = kind
            events.append({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": block})
        b = self.blocks[-1]
        b[kind] += delta[kind]
        events.append({"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta})
        return events

    def _stop(self) -> list[dict]:
        """End the open block (a thinking block gets its signature first: a digest of its text, which clients send back)."""
        i, b = len(self.blocks) - 1, self.blocks[-1]
        events = []
        if self.open == "thinking":
            b["signature"] = hashlib.sha256(b["thinking"].encode()).hexdigest()
            events.append({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": b["signature"]}})
        self.open = None
        return events + [{"type": "content_block_stop", "index": i}]

    def _tool_use(self, call) -> list[dict]:
        events = self._stop() if self.open is not None else []
        args = json.loads(call.arguments)
        call_id = "toolu_" + call.id.removeprefix("call_")
        self.blocks.append({"type": "tool_use", "id": call_id, "name": call.name, "input": args})
        self.n_calls += 1
        i = len(self.blocks) - 1
        events += [{"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": call_id, "name": call.name, "input": {}}},
                   {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": call.arguments}},
                   {"type": "content_block_stop", "index": i}]
        return events

    def stop_reason(self, last) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of the finished reply."""
        if self.n_calls:
            return "tool_use", None
        if last is not None and last.stats.stop == "stop" and self.stop_sequences:
            # which one came is not kept by the session: named when only one was asked for
            return "stop_sequence", self.stop_sequences[0] if len(self.stop_sequences) == 1 else None
        return STOP_REASONS.get(last.finish_reason or "stop", "end_turn") if last is not None else "end_turn", None

    def end(self, last) -> list[dict]:
        reason, seq = self.stop_reason(last)
        out = last.stats.generated if last is not None else 0
        return [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                 "usage": {"output_tokens": out, **self._input(last)}},
                {"type": "message_stop"}]

    def whole(self, last) -> dict:
        reason, seq = self.stop_reason(last)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.blocks,
                "stop_reason": reason, "stop_sequence": seq,
                "usage": {**self._input(last), "output_tokens": last.stats.generated if last is not None else 0}}
