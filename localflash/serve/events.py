"""A job's events as a route reads them: the next one, and a client that leaves meanwhile cancels the job.

Shared by the OpenAI routes (:mod:`.app`) and Anthropic's (:mod:`.anthropic`): one request path.
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from localflash.serve.worker import Job


async def until_event(job: Job, request: Request) -> tuple:
    """The job's next event; a client that leaves meanwhile cancels the job."""
    getter = asyncio.ensure_future(job.events.get())
    watcher = asyncio.ensure_future(wait_disconnect(request))
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


async def wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
