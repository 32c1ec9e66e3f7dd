"""Decodes on a core of their own: how the loop's host work costs when the decode does not sweep its caches.

On a CPU build ``llama_decode`` computes on the calling thread (one llama.cpp thread), so it streams the
model's weights through that core's L1 and L2 and the host work that follows (sampling, the drafter's
feature copy, batch filling, ctypes) starts on cold caches. On a GPU build the same call launches kernels
and the card computes: the host core keeps its caches. :class:`DecodeCore` reproduces that half of a GPU
host on this CPU: every ``llama_decode`` of the contexts it is given runs on one thread pinned to another
core, while the loop stays on the cores it was pinned to. What it leaves out: the shared L3 is still swept
(so the figure is, if anything, high), and the hand-off (an event each way, ~10–50 µs of wall time) counts
inside the decode, as a GPU's launch and synchronize do.

Measured (docs/benchmarks.md, "bench_host with the decodes on the other core"): on the 2-core dev VM the loop's
host time did not go down (block 16, graph+target: 534 / 533 µs a cycle greedy / top-k 40 off-core against 467 / 410
on its own core), so what makes the host work slow after a CPU decode is not the core's private caches but memory
the decode wrote or swept out of the shared L3 (llama.cpp's output and feature buffers, its cache bookkeeping).

Linux only (``os.sched_setaffinity``); a benchmark that asks for it on a machine with one core gets a
:class:`~localflash.errors.LocalflashError`.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

from localflash.errors import LocalflashError


class DecodeCore:
    """One thread on core ``core`` that runs the ``llama_decode`` calls of the contexts :meth:`move` was given.

    Creating it pins the calling thread (and so the threads it starts later, a slot pool's included) to the
    other cores. Calls are one at a time: the caller waits for its decode as it would for its own.
    """

    def __init__(self, core: int):
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        if core not in cores or len(cores) < 2:
            raise LocalflashError(f"cannot decode on core {core}: this process may use cores {sorted(cores)}",
                                  hint="name another of them, on a machine with at least two")
        self.core = core
        self.loop_cores = cores - {core}
        os.sched_setaffinity(0, self.loop_cores)
        self._go, self._done = threading.Event(), threading.Event()
        self._job: tuple | None = None
        self._result = None
        self._moved: list = []  # (context, its own llama_decode)
        self._thread = threading.Thread(target=self._serve, name=f"decode-core-{core}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        os.sched_setaffinity(0, {self.core})
        while True:
            self._go.wait()
            self._go.clear()
            fn, args = self._job
            try:
                self._result = fn(*args)
            except BaseException as e:  # noqa: BLE001 (raised again on the caller's thread)
                self._result = e
            self._done.set()

    def call(self, fn, *args):
        """``fn(*args)`` on the decode core; returns its result (raises its error) on the calling thread."""
        self._job = (fn, args)
        self._done.clear()
        self._go.set()
        self._done.wait()
        result = self._result
        if isinstance(result, BaseException):
            raise result
        return result

    def move(self, ctx) -> None:
        """Make every later ``llama_decode`` of ``ctx`` (a :class:`~localflash.llama.runtime.Context`) run here."""
        decode = ctx._llama_decode
        self._moved.append((ctx, decode))
        ctx._llama_decode = lambda ptr, batch: self.call(decode, ptr, batch)

    @contextmanager
    def at_home(self):
        """Within it the moved contexts decode on the calling thread again (a count of the loop's Python calls
        leaves out the hand-off's: it is the benchmark's, as the decode timers are)."""
        away = [(ctx, ctx._llama_decode) for ctx, _ in self._moved]
        for ctx, decode in self._moved:
            ctx._llama_decode = decode
        try:
            yield
        finally:
            for ctx, call in away:
                ctx._llama_decode = call
