"""Constrained output on the wire: ``response_format`` (``json_object``, ``json_schema``) and llama-server's raw ``grammar``.

Each becomes one keyword of :meth:`localflash.api.LLM.start` (``grammar=`` GBNF text or ``json_schema=``
a schema dict), which compiles it on the model's vocabulary before any token is decoded; decoding
then stays lossless with the loaded drafter (speculative/grammar.py). A malformed field is a 400
here; a grammar or schema llama.cpp cannot take is a 400 from ``serve/errors.py``'s ``error_from``, naming
the field the client sent (``response_format`` for a schema).
"""

from __future__ import annotations

from localflash.serve.errors import APIError

JSON_OBJECT = {"type": "object"}  # what {"type": "json_object"} asks for (llama-server's choice too)


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


def response_format_kwargs(fmt) -> dict:
    """``response_format`` -> the LLM's keyword (``{}`` for text)."""
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        schema = fmt.schema_ if fmt.schema_ is not None else JSON_OBJECT  # llama-server takes a schema here too
        return {"json_schema": schema}
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
            raise _bad("response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}", "response_format")
        return {"json_schema": spec["schema"]}
    raise APIError(400, f"response_format type {fmt.type!r} is not supported (text, json_object or json_schema)",
                   code="unsupported_value", param="response_format")


def grammar_kwargs(grammar) -> dict:
    """A raw GBNF ``grammar`` field -> the LLM's keyword."""
    if grammar is None:
        return {}
    if not isinstance(grammar, str) or not grammar.strip():
        raise _bad("grammar must be a non-empty GBNF string", "grammar")
    return {"grammar": grammar}


def chat_constraint(body) -> dict:
    """A chat request's constraint: ``response_format`` or ``grammar``, not both."""
    fmt, gram = response_format_kwargs(body.response_format), grammar_kwargs(body.grammar)
    if fmt and gram:
        raise _bad("send response_format or grammar, not both", "grammar")
    return fmt or gram

