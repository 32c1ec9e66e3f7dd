"""Mistral ``[TOOL_CALLS]`` calls, both tokenizer generations.

- pre-v11 (Mistral 7B v0.3, Nemo): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "a1B2c3D4e"}, ...]``;
- v11+ (Small 3.2, Devstral, Magistral): ``[TOOL_CALLS]NAME[ARGS]{...}`` (``[CALL_ID]id`` may sit between),
  repeated for parallel calls.

The section runs to the end of the reply. Mistral's templates refuse a history call
id that is not 9 letters or digits, so calls made here get such ids.
"""

from __future__ import annotations

import json
import re

from localflash.serve.toolcalls.base import Format, Section, ToolCall, Tools, alnum_id, call_from_object, dumps, loads_object

START = "[TOOL_CALLS]"
NAMED = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?(?:\[ARGS\])?\s*(\{.*\})\s*$", re.S)


def parse_calls(body: str, tools: Tools) -> list[ToolCall] | None:
    text = body.strip()
    if text.startswith("["):  # pre-v11: one JSON array
        items = json.loads(text)
        if not isinstance(items, list) or not items:
            return None
        calls = [call_from_object(o, tools, new_id=alnum_id) for o in items]
        return calls if all(calls) else None
    calls = []
    for part in text.split(START):
        m = NAMED.match(part)
        if m is None:
            return None
        args = loads_object(m.group(3))
        if args is None:
            return None
        calls.append(ToolCall(m.group(1), dumps(args), m.group(2) or alnum_id()))
    return calls


class Mistral(Format):
    name = "mistral"
    description = "Mistral Nemo/7B v0.3: [TOOL_CALLS][{json}, ...]; Small 3.2/Devstral: [TOOL_CALLS]NAME[ARGS]{json}"
    sections = (Section(START, None, parse_calls),)

    @classmethod
    def detect(cls, template: str) -> bool:
        return START in template

    @staticmethod
    def new_id() -> str:
        return alnum_id()
