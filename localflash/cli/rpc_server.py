"""``localflash rpc-server``: lend this machine's CPU or GPUs to another machine's ``--rpc`` (llama.cpp's rpc-server)."""

from __future__ import annotations

from typing import Optional

import typer

from localflash.cli.app import app


@app.command("rpc-server")
def rpc_server(
    host: str = typer.Option("127.0.0.1", "--host", "-H", help="Address to listen on; anything but loopback needs --allow-remote."),
    port: int = typer.Option(50052, "--port", "-p", help="TCP port (0: a free one, printed at startup)."),
    threads: int = typer.Option(0, "--threads", "-t", help="CPU threads (0: half the cores)."),
    device: Optional[str] = typer.Option(None, "--device", "-d", help="ggml devices to serve, comma-separated (default: CPU)."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host. No authentication: trusted network only."),
):
    """Serve target layers for another machine's `--rpc HOST:PORT` (same localflash build on both ends)."""
    from localflash.api import rpc_server as serve_rpc

    serve_rpc(host, port, threads, allow_remote, device.split(",") if device else None)
