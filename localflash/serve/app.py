"""The OpenAI-compatible routes (FastAPI): chat and text completions, models, health, metrics.

Request bodies become the LLM's arguments in :mod:`.messages`; failures become
OpenAI-style error bodies in :mod:`.errors`. The one LLM is driven by
:class:`~localflash.serve.worker.Worker`; this module reads it only through the
public API (``llm.info()``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sse_starlette import EventSourceResponse

from localflash import __version__
from localflash.serve import schemas as S
from localflash.serve.assistant import ChatStyle, ReplyOptions
from localflash.serve.anthropic import anthropic_router
from localflash.serve.errors import APIError, error_from, install_error_handlers
from localflash.serve.events import until_event
from localflash.serve.messages import chat_request, check_common, completion_request
from localflash.serve.metrics import Metrics
from localflash.serve.replies import ChatReply, CompletionReply, finish_reason, new_id, provenance, timings
from localflash.serve.web import PAGE_PATHS, add_web
from localflash.serve.worker import Job, QueueFull, Worker

OPEN_PATHS = {"/health", "/v1/health", "/v1/models", "/models", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", *PAGE_PATHS}
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": S.ErrorResponse, "description": "Bad request (validation, unsupported field, prompt too long)"},
    401: {"model": S.ErrorResponse, "description": "Missing or wrong API key"},
    404: {"model": S.ErrorResponse, "description": "Unknown model"},
    503: {"model": S.ErrorResponse, "description": "The queue is full (see Retry-After)"},
}
STREAM = {200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE `data:` chunks and `data: [DONE]` when stream is true"}}


class KeyCheck:
    """Bearer-token check as plain ASGI middleware (keeps disconnect detection working)."""

    def __init__(self, app, key: str, metrics: Metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"")  # or Anthropic's clients' x-api-key
            token = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"").strip()
            if not hmac.compare_digest(token, self.key):
                self.metrics.record_error(401)
                err = APIError(401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key")
                await JSONResponse(err.body(), 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(llm, worker: Worker, metrics: Metrics, api_key: str | None = None, log=None, reply: ReplyOptions | None = None) -> FastAPI:
    app = FastAPI(title="localflash", version=__version__,
                  description="OpenAI-compatible server for speculative decoding of GGUF models (localflash serve).")
    info = llm.info()
    model_id = info.name
    aliases = {model_id, info.target.name, info.target.stem}
    style = app.state.style = ChatStyle(info, reply)  # the template's tool-call format and thinking
    log = log or worker.log
    if api_key:
        app.add_middleware(KeyCheck, key=api_key, metrics=metrics)
    install_error_handlers(app, metrics, log)

    # -- helpers ----------------------------------------------------------------

    async def start(kind: str, prompt, params: dict, request: Request) -> tuple[Job, tuple]:
        """Queue a job and wait until it starts decoding (an error is raised before any header is sent)."""
        job = Job(kind, prompt, params, asyncio.get_running_loop())
        try:
            worker.submit(job)
        except QueueFull as e:
            raise APIError(503, f"the server is busy: {e}", "unavailable_error", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)})
        first = await until_event(job, request)
        if first[0] == "error":
            raise error_from(first[1])
        return job, first  # ("started", None): streamed replies send headers now, pings cover a long prefill

    async def events(job: Job, first: tuple):
        """Yield the job's events from ``first`` on; stop at done/error."""
        ev = first
        while True:
            yield ev
            if ev[0] in ("done", "error"):
                return
            ev = await job.events.get()

    # -- routes -------------------------------------------------------------------

    @app.post("/v1/chat/completions", response_model=S.ChatCompletion, responses={**ERRORS, **STREAM})
    async def chat_completions(body: S.ChatCompletionRequest, request: Request):
        check_common(body, model_id, aliases)
        messages, params = chat_request(body)
        plan = style.plan(body, params, llm)
        job, first = await start("chat", messages, params, request)
        reply = ChatReply(new_id("chatcmpl"), model_id, plan)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream:
            return EventSourceResponse(chat_sse(job, first, reply, include_usage), sep="\n", ping=10)
        return await collect(job, first, request, reply.feed, reply.flush, reply.whole)

    async def chat_sse(job: Job, first: tuple, reply: ChatReply, include_usage: bool):
        last = None
        try:
            yield _data(reply.chunk({"role": "assistant", "content": ""}))
            async for kind, val in events(job, first):
                if kind == "error":
                    yield _data(error_from(val).body())
                    return
                if kind == "chunk":
                    extra = provenance(val)  # on the first delta; a cycle whose text is held back still reports
                    for d in reply.feed(val.text) or ([{}] if val.token_ids or val.drafted else []):
                        yield _data(reply.chunk(d, **extra))
                        extra = {}
                    last = val if val.finish_reason else last
                elif kind == "done":
                    last = val or last
            for d in reply.flush():
                yield _data(reply.chunk(d))
            if last is not None:
                yield _data(reply.chunk({}, finish_reason(last, bool(reply.calls)), timings=timings(last)))
                if include_usage:
                    yield _data(reply.usage_chunk(last))
            yield "[DONE]"
        finally:
            job.cancel.set()  # a no-op when it finished; stops it when the client left

    @app.post("/v1/completions", response_model=S.Completion, responses={**ERRORS, **STREAM})
    async def completions(body: S.CompletionRequest, request: Request):
        check_common(body, model_id, aliases)
        prompt, params = completion_request(body)
        job, first = await start("completion", prompt, params, request)
        reply = CompletionReply(new_id("cmpl"), model_id)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def feed(text):
            reply.text.append(text)
            return [text] if text else []

        if body.stream:
            return EventSourceResponse(completion_sse(job, first, reply, include_usage), sep="\n", ping=10)
        return await collect(job, first, request, feed, lambda: [], reply.whole)

    async def completion_sse(job: Job, first: tuple, reply: CompletionReply, include_usage: bool):
        last = None
        try:
            async for kind, val in events(job, first):
                if kind == "error":
                    yield _data(error_from(val).body())
                    return
                if kind == "chunk":
                    if val.text or val.token_ids or val.drafted:
                        yield _data(reply.chunk(val.text, **provenance(val)))
                    last = val if val.finish_reason else last
                elif kind == "done":
                    last = val or last
            if last is not None:
                yield _data(reply.chunk("", finish_reason(last, False), timings=timings(last)))
                if include_usage:
                    yield _data(reply.usage_chunk(last))
            yield "[DONE]"
        finally:
            job.cancel.set()

    async def collect(job: Job, first: tuple, request: Request, feed, flush, whole):
        """A non-streamed reply: drain the job (cancelling it if the client leaves), then one body."""
        ev, last = first, None
        while True:
            kind, val = ev
            if kind == "error":
                raise error_from(val)
            if kind == "chunk":
                feed(val.text)
                last = val if val.finish_reason else last
            elif kind == "done":
                last = val or last
                break
            ev = await until_event(job, request)
        flush()
        if last is None or last.finish_reason == "cancelled":
            raise APIError(503, "the request was cancelled (the server is stopping)", "unavailable_error", code="cancelled")
        return whole(last)

    @app.get("/v1/models", response_model=S.ModelList)
    async def models():
        meta = {"n_ctx": info.n_ctx, "target": str(info.target), "drafter": str(info.drafter_file) if info.drafter_file else None,
                "drafter_kind": info.drafter, "draft_max": info.draft_max, "plan_n_ctx": getattr(info.plan, "n_ctx", None)}
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started, "owned_by": "localflash", "meta": meta}]}

    @app.get("/health", response_model=S.Health)
    async def health():
        running, queued = worker.depth()
        return {"status": "ok", "running": running, "queued": queued}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        running, queued = worker.depth()
        text = metrics.render(running, queued, worker.n_slots, worker.busy_time(), llm.decode_counts())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/slots")
    async def slots():
        """What each slot is doing (llama-server's /slots): state, tokens cached and generated, τ."""
        return llm.slots()

    def openapi() -> dict:
        """FastAPI's schema without its default 422 responses: validation errors are 400 here."""
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for ops in schema.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
    app.include_router(anthropic_router(llm, worker, metrics, model_id, style))  # Anthropic's Messages API (serve/anthropic.py)
    add_web(app, llm, worker.max_queue)  # the chat page at / and its model card
    started = int(time.time())
    return app


def _data(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False)
