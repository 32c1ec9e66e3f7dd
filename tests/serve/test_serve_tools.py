"""Each tool-call format's parser on its own: calls, content, parallel calls, malformed and cut-off calls, types.

Every case is also streamed in deltas of every size (one character up to the whole
text) and must give what the whole text gives.
"""

from __future__ import annotations

import pytest

from localflash.errors import LocalflashError
from localflash.serve.toolcalls import NAMES, detect_format, get_format
from localflash.serve.toolcalls.qwen_xml import convert

from tests.serve.toolcheck import every_size_agrees

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"}, "metric": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}}, "where": {"type": "object"}, "note": {"type": ["string", "null"]}},
    "required": ["city"]}}}]
PARIS = ("get_weather", {"city": "Paris"})
OSLO = ("get_weather", {"city": "Oslo", "days": 2})

HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
XML = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
XML2 = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
DS = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
DS2 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\", \"days\": 2}\n```<｜tool▁call▁end｜>"

CASES = {
    "hermes": [
        ("Just text, no call.", "Just text, no call.", []),
        (HERMES, "", [PARIS]),
        ("Let me check.\n\n" + HERMES, "Let me check.", [PARIS]),
        (HERMES + "\n" + HERMES.replace('"Paris"}', '"Oslo", "days": 2}'), "", [PARIS, OSLO]),
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', "", [PARIS]),  # JSON text
        ('<tool_call>{"name": "f"}</tool_call> done', "done", [("f", {})]),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),  # malformed: content as written
        ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),  # no name
        ('ok <tool_call>{"name": "f", "arguments": {"x": 1}', 'ok <tool_call>{"name": "f", "arguments": {"x": 1}', []),  # cut off
        ("a < b and <tool", "a < b and <tool", []),
        ("Ünïcödé ✓ " + HERMES, "Ünïcödé ✓", [PARIS]),
        # Qwen2.5-Coder's habit: a fenced JSON block naming one of the tools is a call...
        ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', "", [PARIS]),
        # ...one naming something else is an answer that shows JSON
        ('```json\n{"name": "Ada", "arguments": {}}\n```', '```json\n{"name": "Ada", "arguments": {}}\n```', []),
    ],
    "qwen3_xml": [
        (XML, "", [PARIS]),
        ("I will look.\n\n" + XML + "\n" + XML2, "I will look.", [PARIS, OSLO]),
        ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "", [PARIS]),  # without <tool_call>
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nTwo\nlines\n</parameter>\n</function>\n</tool_call>", "",
         [("get_weather", {"city": "Two\nlines"})]),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n", []),
        ("<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", []),
        ("<tool_call>\n<function=get_weather>\nstray text<parameter=city>\nX\n</parameter>\n</function>\n</tool_call>",
         "<tool_call>\n<function=get_weather>\nstray text<parameter=city>\nX\n</parameter>\n</function>\n</tool_call>", []),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}', "", [PARIS, OSLO]),
        ('  {"name": "get_weather", "arguments": {"city": "Paris"}}\n', "", [PARIS]),
        ('{"name": "get_weather", "parameters": {"city": "Par', '{"name": "get_weather", "parameters": {"city": "Par', []),  # cut off
        ('{"a": 1} is a JSON object', '{"a": 1} is a JSON object', []),
        ("The answer is {x}.", "The answer is {x}.", []),
        ('<|python_tag|>brave_search.call(query="x")', '<|python_tag|>brave_search.call(query="x")', []),  # built-in: not JSON
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}]', "", [PARIS]),
        ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]', "", [PARIS, OSLO]),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}', "", [PARIS, OSLO]),
        ('Sure. [TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', "Sure.", [PARIS]),
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"', '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"', []),
        ("[TOOL_CALLS]nonsense", "[TOOL_CALLS]nonsense", []),
        ("[TOOL_C", "[TOOL_C", []),
    ],
    "deepseek": [
        ("<｜tool▁calls▁begin｜>" + DS + "<｜tool▁calls▁end｜>", "", [PARIS]),
        ("Let me see.<｜tool▁calls▁begin｜>" + DS + "\n" + DS2 + "<｜tool▁calls▁end｜>", "Let me see.", [PARIS, OSLO]),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", [PARIS]),  # V3.1
        ("<｜tool▁calls▁begin｜>" + DS, "<｜tool▁calls▁begin｜>" + DS, []),  # cut off before the end marker
        ("<｜tool▁calls▁begin｜>junk<｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜>junk<｜tool▁calls▁end｜>", []),
    ],
}


@pytest.mark.parametrize("name,text,content,calls", [(n, *c) for n, cases in CASES.items() for c in cases])
def test_each_format_parses_whole_and_streamed_at_every_delta_size_alike(name, text, content, calls):
    got = every_size_agrees(get_format(name), TOOLS, text)
    assert got == (content, calls)


def test_mistral_calls_get_nine_character_ids_its_templates_require():
    from localflash.serve.toolcalls import parse_tool_calls

    _, calls = parse_tool_calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', get_format("mistral"), TOOLS)
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    _, calls = parse_tool_calls('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "a1B2c3D4e"}]', get_format("mistral"), TOOLS)
    assert calls[0].id == "a1B2c3D4e"


@pytest.mark.parametrize("raw,schema,value", [
    ("Paris", {"type": "string"}, "Paris"),
    ("42", {"type": "string"}, "42"),  # a string stays as written
    ("42", {"type": "integer"}, 42),
    ("-3", {"type": "number"}, -3),
    ("2.5", {"type": "number"}, 2.5),
    ("true", {"type": "boolean"}, True),
    ("False", {"type": "boolean"}, False),  # the Qwen templates print a history bool with |string
    ("null", {"type": ["string", "null"]}, None),
    ("None", {"type": "integer"}, None),
    ('["a", "b"]', {"type": "array"}, ["a", "b"]),
    ('{"x": 1}', {"type": "object"}, {"x": 1}),
    ('{"x": 1}', {"properties": {"x": {}}}, {"x": 1}),
    ("7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 7),
    ("seven", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "seven"),
    ("soon", {"type": "integer"}, "soon"),  # does not convert: kept as written
    ("[1, 2", {"type": "array"}, "[1, 2"),
    ("whatever", {}, "whatever"),  # untyped
])
def test_xml_values_are_converted_by_the_schema_type(raw, schema, value):
    got = convert(raw, schema)
    assert got == value and type(got) is type(value)


def test_xml_arguments_of_every_type_come_back_typed():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=scale>\n1.5\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n"
            "<parameter=where>\n{\"lat\": 48.9}\n</parameter>\n<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>")
    _, calls = every_size_agrees(get_format("qwen3_xml"), TOOLS, text)
    assert calls == [("get_weather", {"city": "Paris", "days": 3, "scale": 1.5, "metric": True, "tags": ["a"], "where": {"lat": 48.9}, "note": None})]


def test_the_registry_names_every_format_and_refuses_an_unknown_one():
    assert set(NAMES) == {"qwen3_xml", "hermes", "llama3_json", "mistral", "deepseek"}
    with pytest.raises(LocalflashError, match="unknown tool-call format 'nope'") as e:
        get_format("nope")
    assert "qwen3_xml" in e.value.hint
    assert detect_format(None).name == "hermes" and detect_format("{{ messages }}").name == "hermes"
