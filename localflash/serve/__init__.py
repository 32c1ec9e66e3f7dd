"""``localflash serve``: an OpenAI-compatible HTTP server over one loaded LLM.

FastAPI routes (:mod:`.app`), pydantic models (:mod:`.schemas`), one worker
thread with a bounded queue (:mod:`.worker`), Prometheus text (:mod:`.metrics`),
tool-call formats (:mod:`.toolcalls`), thinking and forced calls (:mod:`.assistant`).
"""

from __future__ import annotations

import socket
import sys
import time

from localflash.errors import LocalflashError


def require_stack() -> None:
    """Fail with one line when the web stack (the ``serve`` extra) is not installed."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "sse_starlette") if importlib.util.find_spec(m) is None]
    if missing:
        raise LocalflashError(f"localflash serve needs {', '.join(missing)}", hint="pip install 'localflash[serve]'")


def serve(llm, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None, queue: int = 16, out=None, reply=None) -> None:
    """Bind, print the startup screen, serve until Ctrl-C (or SIGTERM), then stop the worker and close ``llm``."""
    import uvicorn

    from localflash.serve.app import create_app
    from localflash.serve.metrics import Metrics
    from localflash.serve.worker import Worker

    out = out or sys.stderr
    if queue < 0:
        raise LocalflashError(f"--queue must be 0 or more, got {queue}")
    sock = _bind(host, port)
    metrics = Metrics()
    worker = Worker(llm, queue, metrics)
    app = create_app(llm, worker, metrics, api_key=api_key, reply=reply)
    bound = sock.getsockname()[1]
    print(startup_screen(llm, host, bound, api_key, queue, app.state.style), file=out, flush=True)
    worker.start()
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=3, lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: stopping is the normal end here
        pass
    finally:
        worker.stop()
        sock.close()
        print(f"{time.strftime('%H:%M:%S')} stopped", file=out, flush=True)


def _bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise LocalflashError(f"--port must be in 0..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise LocalflashError(f"cannot resolve --host {host!r}: {e.strerror}") from e
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise LocalflashError(f"cannot listen on {host}:{port}: {e.strerror}", hint="pick another --port (0: any free one)") from e
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def startup_screen(llm, host: str, port: int, api_key: str | None, queue: int, style=None) -> str:
    info = llm.info()
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    drafter = info.drafter
    if info.drafter_file:
        drafter += f" ({info.drafter_file.name})"
    if info.draft_max:
        drafter += f", draft ≤ {info.draft_max}" + (", adaptive" if info.adaptive else ", fixed")
    lines = [
        f"localflash serve — OpenAI-compatible API at {url}/v1",
        f"  chat     {url}/ in a browser",
        f"  model    {info.name}" + (f" (pair {info.pair})" if info.pair and info.pair != info.name else ""),
        f"  target   {info.target}",
        f"  drafter  {drafter}",
    ]
    plan = info.plan
    if plan is not None:
        line = f"  plan     n_ctx {plan.n_ctx}, KV {plan.type_k}, n_gpu_layers {plan.n_gpu_layers}"
        if plan.drafter:
            where = f"GPU{plan.drafter_device}" if plan.drafter_device is not None else "host"
            line += f"; drafter on {where}"
        lines.append(line)
        lines += [f"  plan     {c.setting} = {c.value}: {c.reason}" for c in plan.changes]
    if info.kv_unified:
        slots = (f"  slots    {info.slots} sharing one KV pool of {info.n_ctx} tokens: a request may use up to {info.n_ctx} "
                 "(prompt + reply), the slots together as many (a request that does not fit evicts idle caches or waits)")
    else:
        slots = f"  slots    {info.slots} × {info.n_ctx} tokens (one sequence each, decoded together; a request may use {info.n_ctx})"
    if plan is not None:
        kv = sum(d.target_kv for d in plan.devices) + plan.host.target_kv
        share = "" if info.kv_unified else f", {kv / 2**20 / max(1, info.slots):.0f} MiB a slot"
        slots += f"; target KV {kv / 2**20:.0f} MiB in all{share}"
        if plan.drafter_slots:
            slots += f"\n  slots    {plan.drafter_slots_line()}"
    lines += [
        slots,
        *([f"  tools    {style.format.name} calls ({'--tool-format' if style.options.tool_format else 'from the chat template'}); "
           f"thinking {'to reasoning_content' if style.thinks and style.options.reasoning != 'none' else 'in content' if style.thinks else 'none'}"
           + ("" if style.options.thinking is None else f", {'on' if style.options.thinking else 'off'} by default")] if style else []),
        f"  queue    {queue} waiting at most (then 503 + Retry-After); threads {info.threads or 'auto'}",
        f"  auth     {'Bearer API key required' if api_key else 'none (--api-key KEY to require one)'}",
        "  routes   POST /v1/chat/completions, /v1/completions, /v1/messages (Anthropic), /v1/messages/count_tokens; GET /v1/models, /v1/localflash/info, /health, /metrics, /slots, /docs",
        f"  try      curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-d '{{\"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'",
        "  Ctrl-C stops the server",
    ]
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        lines.append("  warning  listening beyond this machine without --api-key")
    return "\n".join(lines)
