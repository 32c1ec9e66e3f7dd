"""OpenAI-style errors: every failure a client can cause is ``{"error": {...}}`` with a 4xx status.

A bug is a plain 500 body (and the traceback in the server log only). The
handlers turn pydantic validation errors into 400s (not FastAPI's 422) and
count every error status in the metrics.
"""

from __future__ import annotations

from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localflash.errors import ContextOverflow, EngineLost, GrammarError, LocalflashError
from localflash.serve.metrics import Metrics


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
    if isinstance(e, GrammarError):  # a json_schema came in response_format (serve/constrained.py)
        return APIError(400, e.message + (f" ({e.hint})" if e.hint else ""), code="invalid_value",
                        param="response_format" if e.param == "json_schema" else e.param)
    if isinstance(e, EngineLost):
        return APIError(503, e.message + (f" ({e.hint})" if e.hint else ""), "unavailable_error", code="engine_lost")
    if isinstance(e, LocalflashError):
        return APIError(400, e.message + (f" ({e.hint})" if e.hint else ""))
    return APIError(500, "internal server error (the server log has the details)", "server_error")


def install_error_handlers(app: FastAPI, metrics: Metrics, log: Callable[[str], None]) -> None:
    """APIError, validation errors, HTTP errors (404, 405) and bugs -> OpenAI-style bodies, each counted."""

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
