"""An rpc-server from this package's own llama.cpp: ``python -m localflash.llama.rpc_server`` (``localflash rpc-server``).

It runs llama.cpp's ``ggml_backend_rpc_start_server`` from the installed wheel's
``libggml-rpc`` (no second build), so the machine lending its memory and the
machine driving it run the same llama.cpp and protocol. The server has no
authentication and trusts what clients send: it binds to 127.0.0.1 unless told
otherwise, and any other address needs ``--allow-remote`` and prints a warning.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import threading

from localflash.errors import LocalflashError
from localflash.llama.rpc_wire import DEFAULT_PORT

WARNING = ("WARNING: the RPC server has no authentication and runs whatever graph a client sends; "
           "anyone who can reach {host}:{port} can use this machine's memory and CPU/GPU. "
           "Keep it on a trusted network (or an SSH tunnel), never the open internet.")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(host: str = "127.0.0.1", port: int = DEFAULT_PORT, threads: int = 0, allow_remote: bool = False,
        devices: list[str] | None = None, out=sys.stderr) -> None:
    """Serve until killed. ``threads`` 0: half the cores, as llama.cpp's rpc-server; ``devices``: ggml names (default CPU)."""
    import os

    if not is_loopback(host) and not allow_remote:
        raise LocalflashError(f"refusing to listen on {host}: the RPC server has no authentication",
                              hint="keep the default 127.0.0.1, or pass --allow-remote on a trusted network")
    if port == 0:  # a free port, for tests and scripts (printed on the first line)
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    with socket.socket() as s:  # llama.cpp only prints "Failed to create server socket" and returns
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LocalflashError(f"cannot listen on {host}:{port} ({e.strerror or e})",
                                  hint="pick another --port, or stop what holds this one") from None
    from localflash.llama import rpc

    threads = threads or max(1, (os.cpu_count() or 2) // 2)
    if not is_loopback(host):
        out.write(WARNING.format(host=host, port=port) + "\n")
    out.write(f"localflash rpc-server listening on {host}:{port} ({', '.join(devices or ['CPU'])}, {threads} threads)\n")
    out.flush()
    done = threading.Event()

    def serve():
        try:
            rpc.serve(host, port, threads, devices)
        finally:
            done.set()

    threading.Thread(target=serve, daemon=True).start()  # the C loop never returns; the main thread stays interruptible
    while not done.wait(0.5):
        pass
    raise LocalflashError(f"the RPC server on {host}:{port} stopped", hint="see its log above")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="localflash rpc-server", description=__doc__.splitlines()[0])
    ap.add_argument("--host", "-H", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --allow-remote)")
    ap.add_argument("--port", "-p", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: a free one)")
    ap.add_argument("--threads", "-t", type=int, default=0, help="CPU threads (0: half the cores)")
    ap.add_argument("--device", "-d", default=None, help="ggml devices to serve, comma-separated (default: CPU)")
    ap.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (no authentication!)")
    a = ap.parse_args(argv)
    try:
        run(a.host, a.port, a.threads, a.allow_remote, a.device.split(",") if a.device else None)
    except LocalflashError as e:
        sys.stderr.write(f"error: {e.message}\n" + (f"hint: {e.hint}\n" if e.hint else ""))
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
