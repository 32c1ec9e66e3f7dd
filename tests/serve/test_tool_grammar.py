"""The forced-call grammars (tool_choice required / named) checked by llama.cpp's own grammar sampler.

Each grammar must compile in llama.cpp, accept a call written in its format (token by
token, then end of text), and refuse another function's name, arguments that break
the schema, and a reply that is not a call. What it accepts parses back to the call.
Tokens come from the small SentencePiece vocabulary shipped in localflash/data.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from localflash.serve.toolcalls import get_format, parse_tool_calls
from localflash.serve.toolcalls.grammar import tool_grammar

L = pytest.importorskip("llama_cpp")

VOCAB = Path(__file__).resolve().parents[2] / "localflash" / "data" / "ggml-vocab-llama-spm.gguf"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "unit": {"type": "string", "enum": ["C", "F"]}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]


@pytest.fixture(scope="module")
def vocab():
    """(vocab, byte -> a token whose piece is that one byte): text goes to the sampler a byte at a time, so
    the check does not depend on how a tokenizer would split it (SentencePiece adds a leading space)."""
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(VOCAB).encode(), params)
    assert model
    v = L.llama_model_get_vocab(model)
    by_byte = {}
    buf = ctypes.create_string_buffer(32)
    for tok in range(L.llama_vocab_n_tokens(v)):
        n = L.llama_token_to_piece(v, tok, buf, len(buf), 0, False)
        if n == 1:
            by_byte.setdefault(buf.raw[0], tok)
    assert len(by_byte) == 256
    yield v, by_byte
    L.llama_model_free(model)


def accepts(vocab, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets ``text`` through (byte by byte) and then lets the reply end."""
    v, by_byte = vocab
    smpl = L.llama_sampler_init_grammar(v, grammar.encode(), b"root")
    assert smpl, "the grammar does not compile in llama.cpp"
    eos = L.llama_vocab_eos(v)
    try:
        for tok in [*(by_byte[b] for b in text.encode()), eos]:
            cell = (L.llama_token_data * 1)(L.llama_token_data(tok, 0.0, 0.0))
            arr = L.llama_token_data_array(ctypes.cast(cell, ctypes.POINTER(L.llama_token_data)), 1, -1, False)
            L.llama_sampler_apply(smpl, ctypes.byref(arr))
            if cell[0].logit == float("-inf"):
                return False
            if tok != eos:
                L.llama_sampler_accept(smpl, tok)
        return True
    finally:
        L.llama_sampler_free(smpl)


CALL = {"city": "Paris", "days": 3, "metric": True, "unit": "C", "tags": ["a b", "c"]}
WRITTEN = {  # one call of get_weather(CALL) as each format's grammar writes it
    "qwen3_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                 "<parameter=metric>\ntrue\n</parameter>\n<parameter=unit>\nC\n</parameter>\n<parameter=tags>\n[\"a b\", \"c\"]\n</parameter>\n"
                 "</function>\n</tool_call>",
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(CALL) + "}\n</tool_call>",
    "llama3_json": '{"name": "get_weather", "parameters": ' + json.dumps(CALL) + "}",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + json.dumps(CALL) + "}]",
    "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + json.dumps(CALL)
                + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
}


@pytest.mark.parametrize("fmt", WRITTEN)
def test_the_required_grammar_takes_a_call_in_the_format_and_it_parses_back(vocab, fmt):
    g = tool_grammar(fmt, TOOLS)
    text = WRITTEN[fmt]
    assert accepts(vocab, g, text)
    content, calls = parse_tool_calls(text, get_format(fmt), TOOLS)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", CALL)]


@pytest.mark.parametrize("fmt", WRITTEN)
def test_the_grammar_refuses_what_is_not_a_valid_call(vocab, fmt):
    g = tool_grammar(fmt, TOOLS)
    text = WRITTEN[fmt]
    assert not accepts(vocab, g, "Sure, let me check the weather.")
    assert not accepts(vocab, g, text.replace("get_weather", "get_wether"))  # no such tool
    assert not accepts(vocab, g, text.replace("3", '"three"' if fmt != "qwen3_xml" else "three", 1))  # integer expected
    assert not accepts(vocab, g, text.replace('"C"' if fmt != "qwen3_xml" else "\nC\n", '"K"' if fmt != "qwen3_xml" else "\nK\n", 1))  # not in the enum
    assert not accepts(vocab, g, text[: len(text) // 2])  # cut off: the reply may not end there


@pytest.mark.parametrize("fmt", WRITTEN)
def test_a_named_function_grammar_takes_only_that_function(vocab, fmt):
    named = tool_grammar(fmt, TOOLS, name="get_time")
    assert not accepts(vocab, named, WRITTEN[fmt])
    time_call = {"qwen3_xml": "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>",
                 "hermes": '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
                 "llama3_json": '{"name": "get_time", "parameters": {"zone": "UTC"}}',
                 "mistral": '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]',
                 "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"UTC\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}[fmt]
    assert accepts(vocab, named, time_call)
    assert not accepts(vocab, named, time_call.replace('"zone"', '"zones"').replace("<parameter=zone>", "<parameter=zones>"))  # required zone missing


def test_required_member_missing_and_optional_ones_in_any_subset(vocab):
    g = tool_grammar("hermes", TOOLS, name="get_weather")
    def wrap(args):
        return '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(args) + "}\n</tool_call>"
    assert accepts(vocab, g, wrap({"city": "Oslo"}))
    assert accepts(vocab, g, wrap({"city": "Oslo", "unit": "F"}))
    assert not accepts(vocab, g, wrap({"days": 2}))  # city is required


@pytest.mark.parametrize("fmt", ["qwen3_xml", "hermes", "mistral", "deepseek"])
def test_parallel_calls_are_allowed_unless_parallel_tool_calls_is_false(vocab, fmt):
    one = WRITTEN[fmt]
    two = {"qwen3_xml": one + "\n" + one, "hermes": one + "\n" + one,
           "mistral": one[:-1] + ", " + one[len("[TOOL_CALLS]["):],
           "deepseek": one.replace("<｜tool▁calls▁end｜>", "\n" + one[len("<｜tool▁calls▁begin｜>"):])}[fmt]
    assert accepts(vocab, tool_grammar(fmt, TOOLS), two)
    assert not accepts(vocab, tool_grammar(fmt, TOOLS, parallel=False), two)
    _, calls = parse_tool_calls(two, get_format(fmt), TOOLS)
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
