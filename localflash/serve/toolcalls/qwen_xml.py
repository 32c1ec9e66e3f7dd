"""Qwen3-Coder / Qwen3.5 / Qwen3.6 XML calls, typed by the tool's JSON schema.

    <tool_call>
    <function=read_file>
    <parameter=path>
    src/app.py
    </parameter>
    </function>
    </tool_call>

A value is raw text: one newline after ``<parameter=P>`` and one before
``</parameter>`` belong to the markup. The text is converted by the parameter's
schema type: a string stays as written; integer, number, boolean, null, object
and array values are read as JSON (booleans and null also as Python prints them,
``True``/``False``/``None``: the Qwen templates render a history value with ``|string``). A value that does not convert, or a parameter
the schema does not type, stays a string (what the model wrote is kept).
"""

from __future__ import annotations

import json
import re

from localflash.serve.toolcalls.base import Format, Section, ToolCall, Tools, dumps

FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _types(schema: dict) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [x for s in schema[key] if isinstance(s, dict) for x in _types(s)]
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return ["string"]
    return ["object"] if "properties" in schema else []


def convert(value: str, schema: dict):
    """Raw parameter text -> the value its schema's type says (a string when it does not convert)."""
    types = _types(schema)
    if not types or types == ["string"]:
        return value
    text = value.strip()
    if text in ("null", "None") and ("null" in types or "string" not in types):  # templates print None as "None"
        return None
    for t in types:
        if t == "string":
            continue
        try:
            if t == "integer":
                return int(text)
            if t == "number":
                n = float(text)
                return int(n) if n.is_integer() and re.fullmatch(r"-?\d+", text) else n
            if t == "boolean":
                low = text.lower()
                if low in ("true", "false"):
                    return low == "true"
                continue
            if t in ("object", "array"):
                v = json.loads(text)
                if isinstance(v, dict if t == "object" else list):
                    return v
        except ValueError:
            continue
    return value


def parse_function(block: str, tools: Tools) -> list[ToolCall] | None:
    m = FUNCTION.match(block)
    if m is None:
        return None
    name, body = m.group(1).strip(), m.group(2)
    args = {}
    rest = PARAM.sub("", body)
    if rest.strip():  # text outside <parameter> blocks: not this format
        return None
    for p in PARAM.finditer(body):
        key, raw = p.group(1).strip(), p.group(2)
        if raw.startswith("\n"):
            raw = raw[1:]
        if raw.endswith("\n"):
            raw = raw[:-1]
        args[key] = convert(raw, tools.property_schema(name, key))
    return [ToolCall(name, dumps(args))]


def parse_bare_function(body: str, tools: Tools) -> list[ToolCall] | None:
    """A ``<function=...>`` block without its ``<tool_call>`` wrapper (a Qwen3.6 habit)."""
    return parse_function("<function=" + body + "</function>", tools)


class QwenXML(Format):
    name = "qwen3_xml"
    description = "Qwen3-Coder, Qwen3.5, Qwen3.6: <tool_call><function=NAME><parameter=P>value</parameter>..."
    sections = (Section("<tool_call>", "</tool_call>", parse_function), Section("<function=", "</function>", parse_bare_function))

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<function=" in template and "<parameter=" in template
