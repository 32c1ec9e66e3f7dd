"""The LLM in a child process, so an engine that dies (an RPC server lost mid-reply) does not take the server down.

llama.cpp's RPC client calls ``abort()`` when a connection to an rpc-server breaks
(``RPC_STATUS_ASSERT`` in ``ggml-rpc.cpp``): no exception, no return code, the whole
process goes. ``localflash serve --rpc ...`` therefore loads its LLM in a child
process (:class:`IsolatedLLM`, the same ``stream``/``info``/``close`` the worker uses).
Requests go over a socket pair as pickled messages, one at a time; chunks come back
as they decode. When the child dies, the request in flight ends with
:class:`~localflash.errors.EngineLost` (HTTP 503) and the next request starts a new
child: with every ``--rpc`` server if they all answer again, else with the plan
re-made without the ones that are down (said in the log), so the server keeps
answering, from fewer devices.

The child is ``python -m localflash.serve.isolated FD``: a fresh interpreter (no fork of
a threaded server), the parent's environment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection

from localflash.errors import ContextOverflow, EngineLost, LocalflashError

READY_TIMEOUT = 600.0  # loading a big target over the network takes a while


def _pack(e: BaseException) -> tuple:
    if isinstance(e, ContextOverflow):
        return ("overflow", e.message, e.hint, e.prompt_tokens, e.n_ctx)
    if isinstance(e, LocalflashError):
        return ("localflash", e.message, e.hint)
    return ("bug", f"{type(e).__name__}: {e}", None)


def _unpack(p: tuple) -> Exception:
    if p[0] == "overflow":
        return ContextOverflow(p[3], p[4], message=p[1], hint=p[2])
    if p[0] == "localflash":
        return LocalflashError(p[1], hint=p[2])
    return RuntimeError(p[1])


class IsolatedLLM:
    """An LLM (``api.open_llm(cfg)``) living in a child process that is restarted when it dies."""

    def __init__(self, cfg, draft: str = "on", log=None):
        self.cfg, self.cfg_full, self.draft = cfg, cfg, draft  # cfg: what the child runs; cfg_full: every --rpc server
        self.log = log or (lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True))
        self.lock = threading.Lock()  # one request at a time over the one pipe
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self._info = None
        self._ids = 0
        self.restarts = 0
        self._start(cfg)  # a server down at start: its one-line error, raised here

    # -- the child -------------------------------------------------------------
    def _start(self, cfg) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        proc = subprocess.Popen([sys.executable, "-m", "localflash.serve.isolated", str(child.fileno())],
                                pass_fds=(child.fileno(),), env=env)
        child.close()
        conn = Connection(parent.detach())
        conn.send((cfg, self.draft))
        if not conn.poll(READY_TIMEOUT):
            proc.kill()
            raise LocalflashError(f"the engine process did not load within {READY_TIMEOUT:.0f} s")
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            proc.wait()
            raise EngineLost(f"the engine process died while loading (exit {proc.returncode})",
                             hint="run with --verbose to see llama.cpp's log") from None
        if msg[0] == "fatal":
            proc.wait()
            raise _unpack(msg[1])
        self.proc, self.conn, self._info, self.cfg = proc, conn, msg[1], cfg

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _restart(self) -> None:
        """A new child: every --rpc server if all answer, else the plan re-made without the ones that are down."""
        from localflash.plan.remote import reachable

        self.restarts += 1
        cfg = self.cfg_full
        up, down = reachable(list(cfg.rpc))
        if down:
            self.log("engine restart without " + "; ".join(f"{e} ({why})" for e, why in down)
                     + (f", on {', '.join(up)} and this machine" if up else ", on this machine alone"))
        self._start(replace(cfg, rpc=tuple(up)))
        self.log(f"engine restarted (#{self.restarts})" + (f" with RPC {', '.join(up)}" if up else ""))

    # -- what the worker uses -------------------------------------------------------------
    def info(self):
        return self._info

    def slots(self) -> list[dict]:
        """The one slot (``/slots``): busy while a request streams; the child's restarts so far."""
        info = self._info
        return [{"id": 0, "state": "decoding" if self.lock.locked() else "idle", "n_ctx": info.n_ctx, "drafter": info.drafter,
                 "engine": "child process" + ("" if self._alive() else " (down: restarts on the next request)"),
                 "restarts": self.restarts, "rpc": list(self.cfg.rpc)}]

    def stream(self, prompt, cancel=None, **params):
        """Send one request; raise its checks' error here (before any decoding), else return its chunk iterator."""
        self.lock.acquire()
        try:
            if not self._alive():
                self._restart()
            self._ids += 1
            rid = self._ids
            self.conn.send(("stream", rid, prompt, params))
            first = self._recv(cancel, rid)
        except BaseException:
            self.lock.release()
            raise
        if first[0] == "error":
            self.lock.release()
            raise _unpack(first[1])
        return _Stream(self, rid, cancel)

    def _recv(self, cancel, rid):
        sent_cancel = False
        while True:
            try:
                if self.conn.poll(0.05):
                    return self.conn.recv()
            except (EOFError, OSError):
                pass
            else:
                if self._alive():
                    if cancel is not None and cancel.is_set() and not sent_cancel:
                        self.conn.send(("cancel", rid))
                        sent_cancel = True
                    continue
            code = self.proc.wait()
            self.conn.close()
            why = f"signal {-code}" if code < 0 else f"exit {code}"
            where = f"; RPC servers: {', '.join(self.cfg.rpc)}" if self.cfg.rpc else ""
            raise EngineLost(f"the engine process died mid-reply ({why}{where})",
                             hint="an RPC server probably went away; the next request restarts the engine "
                                  "(without the servers that stay down)")

    def close(self) -> None:
        if self._alive():
            try:
                self.conn.send(("close",))
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class _Stream:
    def __init__(self, owner: IsolatedLLM, rid: int, cancel):
        self.owner, self.rid, self.cancel, self.stats = owner, rid, cancel, None
        self.done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        try:
            kind, value = self.owner._recv(self.cancel, self.rid)
        except BaseException:
            self._finish()
            raise
        if kind == "chunk":
            self.stats = value.stats
            return value
        self._finish()
        if kind == "error":
            raise _unpack(value)
        raise StopIteration

    def _finish(self):
        if not self.done:
            self.done = True
            self.owner.lock.release()

    def __del__(self):
        if not self.done:  # abandoned mid-stream: drain it so the pipe is clean for the next request
            try:
                if self.cancel is not None:
                    self.cancel.set()
                for _ in self:
                    pass
            except Exception:
                pass


def _child(fd: int) -> None:
    import queue
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us with "close"

    from localflash.api import open_llm

    conn = Connection(fd)
    cfg, draft = conn.recv()
    try:
        llm = open_llm(cfg, draft=draft)
    except BaseException as e:
        conn.send(("fatal", _pack(e)))
        return
    conn.send(("ready", llm.info()))
    requests: queue.Queue = queue.Queue()
    current = {"rid": None, "cancel": None}

    def read():
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                requests.put(None)
                return
            if msg[0] == "cancel":
                if current["rid"] == msg[1] and current["cancel"] is not None:
                    current["cancel"].set()
            else:
                requests.put(msg)

    threading.Thread(target=read, daemon=True).start()
    while (msg := requests.get()) is not None and msg[0] != "close":
        _, rid, prompt, params = msg
        cancel = threading.Event()
        current.update(rid=rid, cancel=cancel)
        try:
            gen = llm.stream(prompt, cancel=cancel, **params)
        except BaseException as e:
            conn.send(("error", _pack(e)))
            continue
        conn.send(("started", None))
        try:
            for chunk in gen:
                conn.send(("chunk", chunk))
            conn.send(("done", None))
        except BaseException as e:
            conn.send(("error", _pack(e)))
    llm.close()


if __name__ == "__main__":
    _child(int(sys.argv[1]))
