"""Constrained output over HTTP: ``response_format`` json_object / json_schema (strict) and llama-server's raw ``grammar``.

The demo pair (SmolLM2-135M + its DFlash drafter) served at one thread with a fixed draft length, driven by
the real ``openai`` client: every constrained reply parses and validates against its schema (``jsonschema``),
the GBNF one matches a regular expression of the same language, a streamed reply assembles to the whole one,
and greedy replies with drafting on equal those with drafting off for the request (``speculative.n_max: 0``).
A bad grammar or schema is a 400 in OpenAI's error shape naming the field.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

openai = pytest.importorskip("openai", reason="the dev extra installs openai")

from localflash.testing.constrained import GBNF, GBNF_LANGUAGE, SCHEMA  # noqa: E402
from localflash.testing.serve import LiveServer  # noqa: E402

PROMPT = "Describe a cat as JSON with its name, whether it is ok and its colour."
STRICT = {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = LiveServer("--pair", "demo", "-t", "1", "--fixed", "--draft-max", "4", "-c", "1024",
                   log=tmp_path_factory.mktemp("serve-constrained") / "server.log", timeout=120)
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.text()


def ask(server, stream: bool = False, prompt: str = PROMPT, **kw) -> tuple[str, str]:
    """(content, finish_reason) of one greedy chat request."""
    args = dict(model=server.model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=48, **kw)
    client = server.client()
    if not stream:
        c = client.chat.completions.create(**args).choices[0]
        return c.message.content, c.finish_reason
    text, finish = [], None
    for ch in client.chat.completions.create(stream=True, **args):
        for c in ch.choices:
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(text), finish


def test_json_schema_strict_replies_validate_and_drafting_changes_nothing(server):
    whole, finish = ask(server, response_format=STRICT)
    assert finish == "stop"
    jsonschema.validate(json.loads(whole), SCHEMA)
    assert ask(server, stream=True, response_format=STRICT) == (whole, finish)
    assert ask(server, response_format=STRICT, extra_body={"speculative.n_max": 0}) == (whole, finish)


def test_json_object_replies_are_json_objects(server):
    text, finish = ask(server, prompt='Give a JSON object with one key "name" for a cat.', response_format={"type": "json_object"})
    assert finish == "stop" and isinstance(json.loads(text), dict)


def test_a_raw_gbnf_grammar_on_chat_and_text_completions(server):
    text, finish = ask(server, extra_body={"grammar": GBNF})
    assert finish == "stop" and re.fullmatch(GBNF_LANGUAGE, text)
    assert ask(server, extra_body={"grammar": GBNF, "speculative.n_max": 0}) == (text, finish)
    c = server.client().completions.create(model=server.model, prompt="A list: ", max_tokens=32, temperature=0,
                                           extra_body={"grammar": GBNF}).choices[0]
    assert c.finish_reason == "stop" and re.fullmatch(GBNF_LANGUAGE, c.text)


@pytest.mark.parametrize("body, param", [
    ({"grammar": 'root ::= "a" nowhere'}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "grammar": GBNF}, "grammar"),
])
def test_a_bad_grammar_or_schema_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"], err
    ok = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200
