"""From request bodies to what the LLM takes: messages, tools, sampling and stop strings, each field checked.

Chat messages go to the LLM in their OpenAI wire form (plain dicts); the model's
template sees them through :func:`localflash.prompt.template_message`, the same
rendering a Python caller of ``LLM.chat`` gets (``developer`` is ``system``, text
parts joined with a newline, tool-call arguments as objects). A field this server
knows but cannot honour is a 400 that names it.
"""

from __future__ import annotations

from localflash.serve import schemas as S
from localflash.serve.constrained import chat_constraint, grammar_kwargs
from localflash.serve.errors import APIError


def check_common(body: S._Generation, model_id: str, aliases: set[str]) -> None:
    """What chat and text completions both refuse: another model, n > 1, penalties, logit_bias."""
    if body.model is not None and body.model not in aliases:
        raise APIError(404, f"the model {body.model!r} is not served here; this server serves {model_id!r}",
                       code="model_not_found", param="model")
    if body.n != 1:
        raise APIError(400, f"n must be 1 (one choice per request), got {body.n}", code="unsupported_value", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise APIError(400, f"{name} is not supported (leave it out or send 0)", code="unsupported_parameter", param=name)
    if body.logit_bias:
        raise APIError(400, "logit_bias is not supported", code="unsupported_parameter", param="logit_bias")


def stops(body: S._Generation) -> list[str] | None:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    if not stop:
        return None
    if len(stop) > 16 or any(not s for s in stop):
        raise APIError(400, "stop takes up to 16 non-empty strings", param="stop")
    return list(stop)


def sampling(body: S._Generation, max_tokens: int | None) -> dict:
    """The LLM's keyword arguments for sampling, length, stop strings and the draft cap (``speculative.n_max``)."""
    return dict(max_tokens=max_tokens, temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                min_p=body.min_p, seed=body.seed, stop=stops(body), draft_max=body.speculative_n_max)


def chat_messages(messages: list[S.Message]) -> list[dict]:
    """Request messages -> OpenAI-style dicts, as a Python caller would pass them (fields not sent left out)."""
    return [m.model_dump(exclude_none=True) for m in messages]


def chat_request(body: S.ChatCompletionRequest) -> tuple[list[dict], dict]:
    """A chat request -> (messages, the LLM's keyword arguments); raises APIError for what is not supported."""
    if body.logprobs or body.top_logprobs:
        raise APIError(400, "logprobs are not supported", code="unsupported_parameter", param="logprobs")
    constraint = chat_constraint(body)  # response_format / grammar (serve/constrained.py)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and body.tool_choice != "none" else None
    params = sampling(body, body.max_completion_tokens or body.max_tokens)
    params["tools"] = tools
    params.update(constraint)
    thinking = (body.chat_template_kwargs or {}).get("enable_thinking")
    if thinking is not None:
        params["thinking"] = bool(thinking)
    return chat_messages(body.messages), params


def completion_request(body: S.CompletionRequest) -> tuple[str, dict]:
    """A text completion request -> (prompt, the LLM's keyword arguments: raw text, no template)."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, f"prompt must be one string (got a list of {len(prompt)})", code="unsupported_value", param="prompt")
        prompt = prompt[0]
    for name, bad in (("echo", body.echo), ("suffix", body.suffix is not None), ("logprobs", body.logprobs is not None),
                      ("best_of", body.best_of not in (None, 1))):
        if bad:
            raise APIError(400, f"{name} is not supported", code="unsupported_parameter", param=name)
    params = sampling(body, body.max_tokens)
    params["raw"] = True
    params.update(grammar_kwargs(body.grammar))
    return prompt, params
