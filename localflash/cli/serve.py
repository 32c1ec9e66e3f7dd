"""``localflash serve``: the OpenAI-compatible server (:mod:`localflash.serve`) over one loaded LLM."""

from __future__ import annotations

from typing import Optional

import typer

from localflash.cli.app import app
from localflash.cli.options import PARALLEL, LoadFlags, shared_options, use


@app.command()
@shared_options
def serve(
    load: LoadFlags = use(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="TCP port (0: any free one, printed at startup)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="LOCALFLASH_API_KEY", help="Require Authorization: Bearer KEY."),
    queue: int = typer.Option(16, "--queue", help="Requests that may wait while every slot is busy; more get 503 + Retry-After."),
    parallel: int = PARALLEL.option(4),
    tool_format: Optional[str] = typer.Option(None, "--tool-format", help="Tool-call format: qwen3_xml, hermes, llama3_json, mistral, deepseek (default: detected from the chat template)."),
    reasoning_format: str = typer.Option("auto", "--reasoning-format", help="auto: <think> text goes to reasoning_content; none: it stays in content (a request's reasoning_format wins)."),
    think: Optional[bool] = typer.Option(None, "--think/--no-think", help="Thinking on/off by default (templates that have the switch; a request's chat_template_kwargs.enable_thinking wins)."),
):
    """Serve the model over an OpenAI-compatible HTTP API (chat, completions, tools, SSE, /metrics)."""
    from localflash.api import open_llm
    from localflash.serve import require_stack, serve as run_server

    require_stack()
    from localflash.serve.assistant import ReplyOptions

    reply = ReplyOptions(tool_format=tool_format, reasoning=reasoning_format, thinking=think).check()  # bad names fail before loading
    from dataclasses import replace

    from localflash.config import check_parallel

    cfg = check_parallel(replace(load.config(), parallel=parallel))
    from localflash.api import short_thread_spin

    short_thread_spin()  # compute threads that wait sleep soon: the server's own threads share the cores (before llama.cpp loads)
    if cfg.rpc:  # llama.cpp aborts the process on a lost RPC server: keep the engine in a child process
        from localflash.serve.isolated import IsolatedLLM

        llm = IsolatedLLM(replace(cfg, parallel=1))
        if cfg.parallel > 1:
            typer.echo(f"note: --rpc serves one request at a time (the engine runs isolated); --parallel {cfg.parallel} -> 1", err=True)
    else:
        llm = open_llm(cfg)
    try:
        run_server(llm, host=host, port=port, api_key=api_key, queue=queue, reply=reply)
    finally:
        llm.close()
