"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

The same request path as ``/v1/chat/completions``: the body becomes the chat route's messages and
arguments (:mod:`.anthropic_wire`), a ``chat`` :class:`~localflash.serve.worker.Job` goes to the
one worker (slots, routing, prefix reuse, tool formats and thinking shared), and the session's
chunks come back as Anthropic content blocks. Streamed replies are Anthropic's SSE events
(``message_start``, ``content_block_start``/``delta``/``stop``, ``message_delta`` with the stop
reason and usage, ``message_stop``, and ``ping`` while a long prompt fills); every error is
``{"type": "error", "error": {"type", "message"}}`` with its HTTP status (mid-stream: an ``error`` event).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sse_starlette import EventSourceResponse

from localflash.serve.anthropic_wire import (THINK_CLOSE, THINK_OPEN, CountTokensRequest, MessageReply, MessagesRequest, chat_messages, chat_tools,
                                             error_body, messages_request, thinking_switch)
from localflash.serve.assistant import after_thinking, constrain
from localflash.serve.errors import APIError, error_from
from localflash.serve.events import until_event
from localflash.serve.toolcalls.grammar import tool_grammar
from localflash.serve.worker import Job, QueueFull


def anthropic_router(llm, worker, metrics, model_id: str, style) -> APIRouter:
    """The Messages routes over ``worker`` (see the module docstring); ``model_id`` names the served model in replies;
    ``style`` (:class:`~localflash.serve.assistant.ChatStyle`): the model's tool-call format and thinking default, as the chat route's."""
    router = APIRouter()

    def fail(err: APIError) -> JSONResponse:
        metrics.record_error(err.status)
        return JSONResponse(error_body(err.status, err.message), err.status, headers=err.headers)

    async def parse(request: Request, model):
        try:
            raw = await request.json()
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the body is not valid JSON: {e}")
        if not isinstance(raw, dict):
            raise APIError(400, "the body must be a JSON object")
        try:
            return model.model_validate(raw)
        except ValidationError as e:
            errs = e.errors()
            parts = [f"{'.'.join(str(x) for x in err.get('loc', ())) or 'body'}: {err.get('msg')}" for err in errs[:4]]
            raise APIError(400, "; ".join(parts) + (f" (+{len(errs) - 4} more)" if len(errs) > 4 else ""))

    @router.post("/v1/messages")
    async def messages(request: Request):
        try:
            body = await parse(request, MessagesRequest)
            msgs, params = messages_request(body)
            calls = forced_calls(body, params)
            job = Job("chat", msgs, params, asyncio.get_running_loop())
            try:
                worker.submit(job)
            except QueueFull as e:
                raise APIError(503, f"the server is busy: {e}", headers={"Retry-After": str(e.retry_after)})
            first = await until_event(job, request)
            if first[0] == "error":
                raise error_from(first[1])
        except APIError as e:
            return fail(e)
        reply = MessageReply(model_id, calls, params["stop"])
        if body.stream:
            return EventSourceResponse(stream(job, first, reply), sep="\n", ping=10)
        try:
            return await whole(job, first, reply, request)
        except APIError as e:
            return fail(e)

    async def stream(job: Job, first: tuple, reply: MessageReply):
        """Anthropic's event sequence; message_start waits for the first chunk (its usage holds the prompt's tokens)."""
        ev, last, started = first, None, False
        try:
            while True:
                kind, val = ev
                if kind == "error":
                    yield _event(error_body(error_from(val).status, error_from(val).message))
                    return
                if kind in ("chunk", "done"):
                    last = val or last
                    if not started and last is not None:
                        started = True
                        reply.begin(_phase_before(val) if kind == "chunk" else "answer")
                        yield _event(reply.start(last))
                        yield _event({"type": "ping"})
                    if kind == "chunk":
                        for e in reply.feed(val.text):
                            yield _event(e)
                    else:
                        break
                ev = await job.events.get()
            if not started:
                yield _event(reply.start(None))
            for e in reply.flush() + reply.end(last):
                yield _event(e)
        finally:
            job.cancel.set()  # a no-op when it finished; stops it when the client left

    async def whole(job: Job, first: tuple, reply: MessageReply, request: Request) -> dict:
        ev, last = first, None
        while True:
            kind, val = ev
            if kind == "error":
                raise error_from(val)
            if kind == "chunk":
                if last is None:
                    reply.begin(_phase_before(val))
                reply.feed(val.text)
                last = val
            elif kind == "done":
                last = val or last
                break
            ev = await until_event(job, request)
        reply.flush()
        if last is None or last.finish_reason == "cancelled":
            raise APIError(503, "the request was cancelled (the server is stopping)")
        return reply.whole(last)

    def forced_calls(body: MessagesRequest, params: dict):
        """The thinking default, and ``tool_choice`` any / tool as the chat route's required / named (a grammar in the
        model's call format); the reply's tool-call parser (None without tools)."""
        asked_thinking = "thinking" in params
        if not asked_thinking and style.options.thinking is not None and style.can_think:
            params["thinking"] = style.options.thinking
        tools = params["tools"]
        choice = body.tool_choice
        if tools and choice is not None and choice.type in ("any", "tool"):
            if style.thinks and not asked_thinking and style.opens_thinking(params.get("thinking")) and not style.opens_thinking(False):
                params["thinking"] = False  # as the chat route: no thinking before a forced call unless asked
            grammar = tool_grammar(style.format.name, tools, choice.name if choice.type == "tool" else None,
                                   parallel=not choice.disable_parallel_tool_use)
            if style.thinks and style.opens_thinking(params.get("thinking")):
                grammar = after_thinking(grammar)
            constrain(params, grammar, llm)
        return style.format.stream(tools) if tools else None

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            body = await parse(request, CountTokensRequest)
            msgs, tools = chat_messages(body), chat_tools(body)
            try:
                n = await asyncio.to_thread(llm.count_tokens, msgs, tools=tools, thinking=thinking_switch(body))
            except Exception as e:  # noqa: BLE001 (a bad conversation is the client's 400)
                raise error_from(e)
        except APIError as e:
            return fail(e)
        return {"input_tokens": n}

    return router


def _phase_before(chunk) -> str:
    """The phase the reply began in (a template may open the thinking block itself): the first chunk's phase, taken
    back over each tag its text holds."""
    flips = chunk.text.count(THINK_OPEN) + chunk.text.count(THINK_CLOSE)
    return chunk.phase if flips % 2 == 0 else ("answer" if chunk.phase == "think" else "think")


def _event(obj: dict) -> dict:
    return {"event": obj["type"], "data": json.dumps(obj, ensure_ascii=False)}

