"""What every tool-call format shares: the call, the format's shape, and one streaming state machine.

A format (:class:`Format`) names its *sections*: text between a start marker and
an end marker (or the end of the reply, for formats that have none) that holds
one or more calls. :class:`CallStream` is fed the reply's text in deltas of any
size. Text outside sections is content; whitespace next to a call is dropped; a
section that parses becomes calls; a section that does not (malformed, or cut off
by ``max_tokens``) stays in the content exactly as written, so nothing is lost and
nothing fails. The whole-text parse is the same machine fed once, so a streamed
reply assembled equals the whole one.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it
    id: str = ""

    def __post_init__(self):
        self.id = self.id or "call_" + secrets.token_hex(12)

    def to_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}

    def deltas(self, index: int) -> list[dict]:
        """The streamed form, as OpenAI sends it: id, type and name first (empty arguments), then the arguments."""
        head = {"index": index, "id": self.id, "type": "function", "function": {"name": self.name, "arguments": ""}}
        out = [head]
        if self.arguments:
            out.append({"index": index, "function": {"arguments": self.arguments}})
        return out


@dataclass(frozen=True)
class Section:
    """One kind of section: ``start`` ... ``end`` (None: to the end of the reply) and how its body parses."""

    start: str
    end: str | None
    parse: Callable[[str, "Tools"], "list[ToolCall] | None"]


class Tools:
    """The request's tools by name (their JSON schemas type XML values and vet habitual variants)."""

    def __init__(self, tools: list[dict] | None = None):
        self.schemas: dict[str, dict] = {}
        for t in tools or []:
            fn = t.get("function", t) if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                params = fn.get("parameters")
                self.schemas[fn["name"]] = params if isinstance(params, dict) else {}

    def __contains__(self, name: str) -> bool:
        return name in self.schemas

    def property_schema(self, function: str, param: str) -> dict:
        props = self.schemas.get(function, {}).get("properties")
        p = props.get(param) if isinstance(props, dict) else None
        return p if isinstance(p, dict) else {}


class Format:
    """A tool-call format: its name, the templates it belongs to, its sections and how calls render back.

    Subclasses set ``name``, ``sections`` and ``detect`` (does a chat template's source use this
    format?), and may set ``bare_json_start`` (a reply that *begins* with ``{`` is a call section:
    Llama 3.x writes calls as bare JSON).
    """

    name = ""
    description = ""
    sections: tuple[Section, ...] = ()
    bare_json_start = False
    bare_json_parse: Callable[[str, Tools], "list[ToolCall] | None"] | None = None

    @classmethod
    def detect(cls, template: str) -> bool:
        return False

    @staticmethod
    def new_id() -> str:
        return "call_" + secrets.token_hex(12)

    def stream(self, tools: list[dict] | None = None) -> "CallStream":
        return CallStream(self, Tools(tools))


class CallStream:
    """Feed text deltas; get back (content delta, calls completed by this delta)."""

    def __init__(self, fmt: Format, tools: Tools):
        self.fmt, self.tools = fmt, tools
        self.buf = ""  # text not yet decided
        self.section: Section | None = None  # inside this section (its start marker already taken off)
        self.ws = ""  # whitespace before the open section
        self.after_call = False  # drop whitespace that follows a call
        self.started = False  # some text (not whitespace) was decided already
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buf += text
        out: list[str] = []
        new: list[ToolCall] = []
        while True:
            if self.section is not None:
                sec = self.section
                if sec.end is None:
                    break  # runs to the end of the reply: decided in flush()
                end = self.buf.find(sec.end)
                if end < 0:
                    break
                body, self.buf = self.buf[:end], self.buf[end + len(sec.end):]
                self.section = None
                self._close(sec, body, sec.end, out, new)
                continue
            if self.after_call:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self.after_call = False
            if self.fmt.bare_json_start and not self.started:
                stripped = self.buf.lstrip()
                if not stripped:
                    break
                self.started = True
                if stripped.startswith("{"):
                    self.ws, self.buf = self.buf[: len(self.buf) - len(stripped)], stripped
                    self.section = Section("", None, self.fmt.bare_json_parse)
                    continue
            hit = self._first_start()
            if hit is not None:
                at, sec = hit
                before = self.buf[:at].rstrip()
                out.append(before)
                self.ws = self.buf[len(before):at]  # given back if the section is not a call
                self.buf = self.buf[at + len(sec.start):]
                self.section = sec
                self.started = True
                continue
            # hold back a tail that may begin a marker, and trailing whitespace that may precede one
            keep = self._partial_start()
            body = self.buf[: len(self.buf) - keep]
            ws = len(body) - len(body.rstrip())
            piece = body[: len(body) - ws]
            if piece:
                self.started = True
            out.append(piece)
            self.buf = self.buf[len(body) - ws:]
            break
        self.calls += new
        return "".join(out), new

    def flush(self) -> tuple[str, list[ToolCall]]:
        """End of the reply: a section that runs to the end is decided now; anything held back is content."""
        out: list[str] = []
        new: list[ToolCall] = []
        if self.section is not None:
            sec, body = self.section, self.buf
            self.section, self.buf = None, ""
            if sec.end is None:
                self._close(sec, body, "", out, new)
            else:  # cut off before its end marker: content as written
                out.append(self.ws + sec.start + body)
        rest = self.buf
        self.buf = ""
        if self.after_call:
            rest = rest.lstrip()
        out.append(rest)
        self.calls += new
        return "".join(out), new

    def _close(self, sec: Section, body: str, end: str, out: list[str], new: list[ToolCall]) -> None:
        try:
            calls = sec.parse(body, self.tools)
        except (ValueError, TypeError, KeyError, AttributeError):
            calls = None
        if not calls:
            out.append(self.ws + sec.start + body + end)
            self.started = True
            return
        new += calls
        self.after_call = True

    def _first_start(self) -> tuple[int, Section] | None:
        best = None
        for sec in self.fmt.sections:
            at = self.buf.find(sec.start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, sec)
        return best

    def _partial_start(self) -> int:
        """Length of the longest suffix of the buffer that is a proper prefix of a start marker."""
        n = 0
        for sec in self.fmt.sections:
            for k in range(min(len(sec.start) - 1, len(self.buf)), n, -1):
                if sec.start.startswith(self.buf[-k:]):
                    n = k
                    break
        return n


# -- helpers the formats share ------------------------------------------------------

def call_from_object(obj, tools: Tools, args_keys=("arguments", "parameters"), need_known: bool = False, new_id=None) -> ToolCall | None:
    """``{"name": ..., "arguments": {...}}`` (or ``parameters``) -> a call; None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if need_known and obj["name"] not in tools:
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as JSON text
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else (new_id() if new_id else "")
    return ToolCall(obj["name"], dumps(args), call_id)


def dumps(args: dict) -> str:
    return json.dumps(args, ensure_ascii=False)


def loads_object(text: str) -> dict | None:
    obj = json.loads(text)
    return obj if isinstance(obj, dict) else None


ALNUM = string.ascii_letters + string.digits


def alnum_id(n: int = 9) -> str:
    return "".join(secrets.choice(ALNUM) for _ in range(n))


@dataclass
class Registry:
    formats: dict[str, type[Format]] = field(default_factory=dict)

    def add(self, cls: type[Format]) -> type[Format]:
        self.formats[cls.name] = cls
        return cls
