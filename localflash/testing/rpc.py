"""rpc-servers on 127.0.0.1 for tests and benchmarks, and a TCP proxy that delays (and counts) what passes.

:class:`RpcServer` runs ``python -m localflash.llama.rpc_server`` (this package's own
llama.cpp) on a free port. :class:`DelayProxy` forwards one port to another and holds
every chunk of bytes for ``delay_ms`` in each direction before passing it on, which
adds ``2 × delay_ms`` to every request/response round trip like a slower link would,
and counts the bytes and the client→server bursts (a burst: bytes sent after the other
side last spoke, i.e. one round trip).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """One rpc-server process on 127.0.0.1 (CPU backend); ``exact``: ggml's batch-invariant CPU matmuls, as ``--exact``."""

    def __init__(self, threads: int = 1, exact: bool = True, port: int | None = None, log: Path | None = None, timeout: float = 60):
        from localflash.llama.rpc_wire import probe
        from localflash.errors import LocalflashError

        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        env = dict(os.environ)
        if exact:
            env["GGML_CPU_TILED_MM"] = "0"
        self.log = log
        out = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "localflash.llama.rpc_server", "--port", str(self.port),
                                      "--threads", str(threads)], stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            try:
                probe(self.endpoint, timeout=2.0)
                return
            except LocalflashError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"rpc-server on {self.endpoint} did not start (exit {self.proc.returncode})")
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


class DelayProxy:
    """127.0.0.1:``port`` → ``target`` (HOST:PORT), every chunk held ``delay_ms`` each way; a background thread."""

    def __init__(self, target: str, delay_ms: float):
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.delay = delay_ms / 1000.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self.bytes_up = self.bytes_down = self.bursts = 0
        self.lock = threading.Lock()
        self._last_dir = "down"
        threading.Thread(target=self._accept, daemon=True).start()

    def reset_counts(self) -> None:
        with self.lock:
            self.bytes_up = self.bytes_down = self.bursts = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        import collections

        pending: collections.deque = collections.deque()
        cv = threading.Condition()
        closed = [False]

        def writer():
            while True:
                with cv:
                    while not pending and not closed[0]:
                        cv.wait()
                    if not pending and closed[0]:
                        break
                    due, data = pending.popleft()
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    break
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=writer, daemon=True).start()
        while True:
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            with self.lock:
                if direction == "up":
                    self.bytes_up += len(data)
                    if data and self._last_dir != "up":
                        self.bursts += 1
                else:
                    self.bytes_down += len(data)
                if data:
                    self._last_dir = direction
            with cv:
                if not data:
                    closed[0] = True
                    cv.notify()
                    return
                pending.append((time.perf_counter() + self.delay, data))
                cv.notify()

    def close(self) -> None:
        self.listener.close()
