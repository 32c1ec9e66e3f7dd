"""Llama 3.1 / 3.2 / 3.3 JSON calls: ``{"name": ..., "parameters": {...}}``, bare or after ``<|python_tag|>``.

The call is the whole reply (the template asks for nothing else), so a reply that
begins with ``{`` is held back to its end and parsed then: one object, or several
separated by ``;`` (a habit of the 3.x models). Built-in tool calls written as
Python (``brave_search.call(query=...)``) are not JSON and stay content.
"""

from __future__ import annotations

import json

from localflash.serve.toolcalls.base import Format, Section, ToolCall, Tools, call_from_object


def parse_json_calls(body: str, tools: Tools) -> list[ToolCall] | None:
    text = body.strip()
    dec = json.JSONDecoder()
    calls, i = [], 0
    while i < len(text):
        obj, j = dec.raw_decode(text, i)
        call = call_from_object(obj, tools, args_keys=("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        i = j
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
    return calls or None


class Llama3JSON(Format):
    name = "llama3_json"
    description = "Llama 3.1-3.3: bare JSON {\"name\", \"parameters\"} or <|python_tag|>{json}"
    sections = (Section("<|python_tag|>", None, parse_json_calls),)
    bare_json_start = True
    bare_json_parse = staticmethod(parse_json_calls)

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<|start_header_id|>" in template and ("<|python_tag|>" in template or "ipython" in template)
