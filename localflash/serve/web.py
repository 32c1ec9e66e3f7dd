"""The chat page at ``/`` and the model card it reads, ``GET /v1/localflash/info``.

The page is hand-written files in ``static/`` (HTML, CSS, three JS modules; no build step, nothing
fetched from elsewhere: a Content-Security-Policy keeps it to this origin). It
talks to the server only through ``POST /v1/chat/completions`` (streamed; the
optional ``localflash`` field of each chunk says which tokens were accepted
drafts) and this module's JSON endpoint. The page's own files are open; the
API key, if the server has one, guards everything else, so the page asks for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, Field

from localflash import __version__

STATIC = Path(__file__).with_name("static")
JS = "text/javascript; charset=utf-8"
FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/style.css": ("style.css", "text/css; charset=utf-8"),
         "/app.js": ("app.js", JS), "/reply.js": ("reply.js", JS), "/markdown.js": ("markdown.js", JS)}
PAGE_PATHS = frozenset(FILES)  # served without the API key (the page asks for it)
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
}


class Slots(BaseModel):
    parallel: int = Field(..., description="Requests decoded together (--parallel), each with n_ctx tokens of context.")
    queue: int = Field(..., description="Requests that may wait while every slot is busy (then 503 + Retry-After).")


class Info(BaseModel):
    """What this server runs: the model card the chat page shows."""

    id: str = Field(..., description="The model id (as in /v1/models).")
    version: str
    pair: str | None = Field(None, description="The models.toml pair, if one was named.")
    target: str = Field(..., description="The target GGUF file.")
    drafter: str = Field(..., description="Drafter kind in use: dflash, draft, eagle3, ngram, mtp (+ngram), or none.")
    drafter_file: str | None = None
    draft_max: int = Field(..., description="Longest draft per cycle (0: plain decoding).")
    adaptive: bool = Field(..., description="The draft length follows measured acceptance and costs.")
    n_ctx: int = Field(..., description="Context one request may use: the whole pool with a unified KV pool, else each slot's share.")
    threads: int = Field(..., description="CPU threads asked for (0: automatic).")
    thinking: bool = Field(..., description="The chat template has a thinking switch (chat_template_kwargs.enable_thinking).")
    slots: Slots
    plan: dict[str, Any] | None = Field(None, description="The memory plan it loaded with, as `localflash plan --json` prints it.")


def info(llm, queue: int) -> dict:
    i = llm.info()
    return {
        "id": i.name, "version": __version__, "pair": i.pair, "target": str(i.target), "drafter": i.drafter,
        "drafter_file": str(i.drafter_file) if i.drafter_file else None, "draft_max": i.draft_max, "adaptive": i.adaptive,
        "n_ctx": i.n_ctx, "threads": i.threads, "thinking": i.thinking, "slots": {"parallel": i.slots, "queue": queue},
        "plan": json.loads(i.plan.to_json()) if i.plan is not None else None,
    }


def _file_route(body: bytes, media: str):
    async def page() -> Response:  # read once: the package's files do not change under a running server
        return Response(body, media_type=media, headers=HEADERS)

    return page


def add_web(app: FastAPI, llm, queue: int) -> None:
    """Add the page's files and the info endpoint to ``app``."""
    for path, (name, media) in FILES.items():
        app.add_api_route(path, _file_route((STATIC / name).read_bytes(), media), methods=["GET"], include_in_schema=False)

    @app.get("/v1/localflash/info", response_model=Info, summary="The model card: pair, drafter, context, memory plan, slots")
    async def localflash_info():
        return info(llm, queue)
