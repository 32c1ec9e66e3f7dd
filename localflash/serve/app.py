"""The OpenAI-compatible routes (FastAPI): chat and text completions, models, health, metrics.

Every failure a client can cause is an OpenAI-style ``{"error": {...}}`` body
with a 4xx status; a bug is a plain 500 body and a traceback in the server log
only. The one LLM is driven by :class:`~localflash.serve.worker.Worker`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localflash import __version__
from localflash.errors import ContextOverflow, LocalflashError
from localflash.serve import schemas as S
from localflash.serve.metrics import Metrics
from localflash.serve.replies import ChatReply, CompletionReply, finish_reason, new_id, provenance, timings
from localflash.serve.worker import Job, QueueFull, Worker

OPEN_PATHS = {"/health", "/v1/health", "/v1/models", "/models", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": S.ErrorResponse, "description": "Bad request (validation, unsupported field, prompt too long)"},
    401: {"model": S.ErrorResponse, "description": "Missing or wrong API key"},
    404: {"model": S.ErrorResponse, "description": "Unknown model"},
    503: {"model": S.ErrorResponse, "description": "The queue is full (see Retry-After)"},
}
STREAM = {200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE `data:` chunks and `data: [DONE]` when stream is true"}}


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers, self.extra = headers, extra

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param, **self.extra}}


def error_from(e: Exception, param: str = "messages") -> APIError:
    """A worker-side exception -> what the client sees."""
    if isinstance(e, ContextOverflow):
        return APIError(400, e.message, code="context_length_exceeded", param=param,
                        n_prompt_tokens=e.prompt_tokens, n_ctx=e.n_ctx)
    if isinstance(e, LocalflashError):
        return APIError(400, e.message + (f" ({e.hint})" if e.hint else ""))
    return APIError(500, "internal server error (the server log has the details)", "server_error")


class KeyCheck:
    """Bearer-token check as plain ASGI middleware (keeps disconnect detection working)."""

    def __init__(self, app, key: str, metrics: Metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            token = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, self.key):
                self.metrics.record_error(401)
                err = APIError(401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key")
                await JSONResponse(err.body(), 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(llm, worker: Worker, metrics: Metrics, api_key: str | None = None, log=None) -> FastAPI:
    app = FastAPI(title="localflash", version=__version__,
                  description="OpenAI-compatible server for speculative decoding of GGUF models (localflash serve).")
    model_id = llm.name
    aliases = {model_id, llm.config.target.name, llm.config.target.stem}
    n_ctx = llm.engine.ctx.n_ctx
    log = log or worker.log
    if api_key:
        app.add_middleware(KeyCheck, key=api_key, metrics=metrics)

    def fail(err: APIError) -> JSONResponse:
        metrics.record_error(err.status)
        return JSONResponse(err.body(), err.status, headers=err.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return fail(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return fail(APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", code="invalid_json"))
        parts = []
        for err in errs[:4]:
            loc = ".".join(str(x) for x in err.get("loc", ())[1:]) or "body"
            parts.append(f"{loc}: {err.get('msg')}")
        more = f" (+{len(errs) - 4} more)" if len(errs) > 4 else ""
        param = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        return fail(APIError(400, "; ".join(parts) + more, code="invalid_value", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return fail(APIError(e.status_code, str(e.detail), code=code, headers=getattr(e, "headers", None)))

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):
        import traceback

        log(traceback.format_exc().rstrip())
        return fail(APIError(500, "internal server error (the server log has the details)", "server_error"))

    # -- helpers ----------------------------------------------------------------

    def check_common(body: S._Generation) -> None:
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
        return dict(max_tokens=max_tokens, temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                    min_p=body.min_p, seed=body.seed, stop=stops(body), draft_max=body.speculative_n_max)

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

    async def until_event(job: Job, request: Request) -> tuple:
        """The job's next event; a client that leaves meanwhile cancels the job."""
        getter = asyncio.ensure_future(job.events.get())
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                return getter.result()
            job.cancel.set()
            return await getter  # the worker still answers (cancelled or skipped)
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        finally:
            watcher.cancel()
            if not getter.done():
                getter.cancel()

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
        check_common(body)
        if body.logprobs or body.top_logprobs:
            raise APIError(400, "logprobs are not supported", code="unsupported_parameter", param="logprobs")
        if body.response_format is not None and body.response_format.type != "text":
            raise APIError(400, f"response_format {body.response_format.type!r} is not supported (only text)",
                           code="unsupported_value", param="response_format")
        if body.tool_choice == "required" or isinstance(body.tool_choice, S.NamedToolChoice):
            raise APIError(400, "tool_choice can be 'auto' or 'none' here (the model decides whether to call)",
                           code="unsupported_value", param="tool_choice")
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and body.tool_choice != "none" else None
        params = sampling(body, body.max_completion_tokens or body.max_tokens)
        params["tools"] = tools
        thinking = (body.chat_template_kwargs or {}).get("enable_thinking")
        if thinking is not None:
            params["thinking"] = bool(thinking)
        job, first = await start("chat", [template_message(m) for m in body.messages], params, request)
        reply = ChatReply(new_id("chatcmpl"), model_id, tools is not None)
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
        check_common(body)
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
        st = getattr(llm.engine, "plan", None)
        meta = {"n_ctx": n_ctx, "target": str(llm.config.target), "drafter": str(llm.config.drafter) if llm.config.drafter else None,
                "drafter_kind": llm.drafter, "draft_max": llm.engine.policy.max_draft, "plan_n_ctx": getattr(st, "n_ctx", None)}
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started, "owned_by": "localflash", "meta": meta}]}

    @app.get("/health", response_model=S.Health)
    async def health():
        running, queued = worker.depth()
        return {"status": "ok", "running": running, "queued": queued}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        running, queued = worker.depth()
        return PlainTextResponse(metrics.render(running, queued), media_type="text/plain; version=0.0.4")

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
    started = int(time.time())
    return app


def template_message(m: S.Message) -> dict:
    """A request message -> the dict a chat template expects (arguments as objects, text parts joined)."""
    content = m.content
    if isinstance(content, list):
        content = "\n".join(p.text for p in content)
    d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
    if m.name:
        d["name"] = m.name
    if m.tool_calls:
        d["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    return d


def _arguments(args):
    if isinstance(args, dict):
        return args
    try:
        parsed = json.loads(args)
    except ValueError:
        return args
    return parsed if isinstance(parsed, dict) else args


def _data(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False)


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
