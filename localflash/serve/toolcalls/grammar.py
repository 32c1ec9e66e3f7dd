"""GBNF grammars that force a tool call in the model's own format (``tool_choice`` required or named).

The grammar writes the call as the chat template renders one, so the parser of the
same format reads it back; the arguments follow each tool's JSON schema
(:class:`SchemaRules`: objects with their properties, required ones first,
strings, numbers, integers, booleans, null, arrays, enums, consts, anyOf/oneOf and
type lists; anything else is any JSON value). XML formats write string values as
raw text and the others as JSON, as the templates do. Markers that are control
tokens (``[TOOL_CALLS]``, ``<｜tool▁calls▁begin｜>``) are written as their text,
which the parsers read the same way.

``tool_grammar(format_name, tools, name=None, parallel=True)`` is the entry point;
the text it returns is what llama.cpp's grammar parser takes (``root`` rule).
"""

from __future__ import annotations

import json
import re

JSON_RULES = r'''ws ::= [ \t\n]{0,8}
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ([0-9] | [1-9] [0-9]{0,15})
json-number ::= json-integer ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ( ws "," ws json-string ws ":" ws json-value )* )? ws "}"
json-array ::= "[" ws ( json-value ( ws "," ws json-value )* )? ws "]"
xml-text ::= ( [^<] | "<" [^/] )*'''

PRIMITIVE = {"string": "json-string", "integer": "json-integer", "number": "json-number", "boolean": "json-boolean", "null": "json-null"}


def literal(text: str) -> str:
    """A GBNF string literal for ``text``."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class SchemaRules:
    """JSON schema -> GBNF rules, named after where they sit (``fn-get-weather-city``)."""

    def __init__(self):
        self.rules: dict[str, str] = {}

    def name(self, hint: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9]+", "-", hint).strip("-").lower() or "r"
        n, i = base, 1
        while n in self.rules:
            i += 1
            n = f"{base}-{i}"
        self.rules[n] = ""  # reserved
        return n

    def add(self, hint: str, body: str) -> str:
        n = self.name(hint)
        self.rules[n] = body
        return n

    def value(self, schema, hint: str) -> str:
        """The rule (name or inline expression) for a JSON value that follows ``schema``."""
        if not isinstance(schema, dict) or not schema:
            return "json-value"
        if "const" in schema:
            return literal(json.dumps(schema["const"], ensure_ascii=False))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return "(" + " | ".join(literal(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                alts = [self.value(s, f"{hint}-{i}") for i, s in enumerate(schema[key])]
                return self.add(hint, " | ".join(alts))
        t = schema.get("type")
        if isinstance(t, list):
            return self.add(hint, " | ".join(self.value({**schema, "type": x}, f"{hint}-{x}") for x in t)) if t else "json-value"
        if t in PRIMITIVE:
            return PRIMITIVE[t]
        if t == "array":
            item = self.value(schema.get("items"), f"{hint}-item")
            return self.add(hint, f'"[" ws ( {item} ( ws "," ws {item} )* )? ws "]"')
        if t == "object" or "properties" in schema:
            return self.object(schema, hint)
        return "json-value"

    def object(self, schema: dict, hint: str) -> str:
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return "json-object"
        required = [k for k in schema.get("required", []) if k in props]
        optional = [k for k in props if k not in required]

        def kv(k):
            return f'{literal(json.dumps(k, ensure_ascii=False))} ws ":" ws {self.value(props[k], f"{hint}-{k}")}'

        return self.add(hint, self.members([kv(k) for k in required], [kv(k) for k in optional], hint, '"{" ws ', ' ws "}"', ' ws "," ws '))

    def members(self, required: list[str], optional: list[str], hint: str, open_: str, close: str, sep: str) -> str:
        """Required members in order, then any of the optional ones (in order): the body of a rule."""
        if required:
            return open_ + sep.join(required) + "".join(f" ({sep}{m} )?" for m in optional) + close
        if not optional:
            return open_ + close
        firsts = []
        for i, m in enumerate(optional):  # the first member present decides which may follow
            firsts.append(m + "".join(f" ({sep}{o} )?" for o in optional[i + 1:]))
        first = self.add(f"{hint}-first", " | ".join(f"( {f} )" for f in firsts))
        return f"{open_}{first}?{close}"

    def text(self, root: str) -> str:
        lines = [f"root ::= {root}"] + [f"{n} ::= {b}" for n, b in self.rules.items() if b]
        return "\n".join(lines) + "\n" + JSON_RULES + "\n"


def _fn_schemas(tools: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for t in tools:
        fn = t.get("function", t)
        params = fn.get("parameters")
        out.append((fn["name"], params if isinstance(params, dict) else {}))
    return out


def _xml_params(r: SchemaRules, name: str, schema: dict, hint: str) -> str:
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [k for k in schema.get("required", []) if k in props]
    optional = [k for k in props if k not in required]

    def block(k):
        s = props[k] if isinstance(props[k], dict) else {}
        if s.get("type") == "string" and isinstance(s.get("enum"), list):  # raw text, one of the values
            value = "(" + " | ".join(literal(str(v)) for v in s["enum"]) + ")"
        elif s.get("type") == "string" and "const" not in s:
            value = "xml-text"
        else:  # other types are written as JSON
            value = r.value(s, f"{hint}-{k}")
        return f'{literal(f"<parameter={k}>" + chr(10))} {value} {literal(chr(10) + "</parameter>" + chr(10))}'

    parts = [block(k) for k in required] + [f"( {block(k)} )?" for k in optional]
    if not props:  # no schema: any parameters
        parts = [f'( {literal("<parameter=")} [a-zA-Z0-9_.-]+ {literal(">" + chr(10))} xml-text {literal(chr(10) + "</parameter>" + chr(10))} )*']
    return " ".join(parts) or '""'


def _call(r: SchemaRules, fmt: str, name: str, schema: dict) -> str:
    """One call of ``name`` as format ``fmt`` writes it (the markers around a section excepted)."""
    hint = f"fn-{name}"
    args = r.value(schema or {"type": "object"}, f"{hint}-args") if schema else "json-object"
    q = literal(json.dumps(name, ensure_ascii=False))
    if fmt == "qwen3_xml":
        return f'{literal(f"<tool_call>" + chr(10) + f"<function={name}>" + chr(10))} {_xml_params(r, name, schema, hint)} {literal("</function>" + chr(10) + "</tool_call>")}'
    if fmt == "hermes":
        return f'{literal("<tool_call>" + chr(10) + "{" + chr(34) + "name" + chr(34) + ": ")} {q} {literal(", " + chr(34) + "arguments" + chr(34) + ": ")} {args} {literal("}" + chr(10) + "</tool_call>")}'
    if fmt == "llama3_json":
        return f'{literal("{" + chr(34) + "name" + chr(34) + ": ")} {q} {literal(", " + chr(34) + "parameters" + chr(34) + ": ")} {args} "}}"'
    if fmt == "mistral":
        return f'{literal("{" + chr(34) + "name" + chr(34) + ": ")} {q} {literal(", " + chr(34) + "arguments" + chr(34) + ": ")} {args} "}}"'
    if fmt == "deepseek":
        return (f'{literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + chr(10) + "```json" + chr(10))} {args} '
                f'{literal(chr(10) + "```<｜tool▁call▁end｜>")}')
    raise ValueError(f"no grammar for the tool-call format {fmt!r}")


def tool_grammar(fmt: str, tools: list[dict], name: str | None = None, parallel: bool = True) -> str:
    """GBNF forcing one call (more when ``parallel``) of the tools (only ``name`` when given), in format ``fmt``."""
    fns = [(n, s) for n, s in _fn_schemas(tools) if name is None or n == name]
    if not fns:
        raise ValueError(f"no tool named {name!r}")
    r = SchemaRules()
    call = r.add("call", " | ".join(f"( {_call(r, fmt, n, s)} )" for n, s in fns))
    if fmt in ("qwen3_xml", "hermes"):
        root = f'{call} ( "\\n" {call} )*' if parallel else call
    elif fmt == "llama3_json":
        root = call  # one call per turn: the Llama 3.x templates refuse more
    elif fmt == "mistral":
        root = f'"[TOOL_CALLS][" {call} ( ", " {call} )* "]"' if parallel else f'"[TOOL_CALLS][" {call} "]"'
    else:  # deepseek
        more = f' ( "\\n" {call} )*' if parallel else ""
        root = f'{literal("<｜tool▁calls▁begin｜>")} {call}{more} {literal("<｜tool▁calls▁end｜>")}'
    return r.text(root)
