"""Worker threads drive the one LLM, one per slot; requests wait in a bounded FIFO queue.

With one slot (``--parallel 1``) one thread serves one request at a time. With N
slots (the LLM's ``n_slots``) thread i runs requests on slot i; the LLM's slot pool
decodes every running request in each target pass, so N requests progress together.

The HTTP side (asyncio) submits a :class:`Job` and reads its events from an
asyncio queue: ``("started", None)`` once the request passed every check
(before any decoding, so errors can still be HTTP statuses), ``("chunk", Chunk)`` per step, then ``("done", last chunk)`` or
``("error", exception)``. Setting ``job.cancel`` (a client went away) ends the
generation at the next draft–verify cycle; a job cancelled while it waited is
skipped. Every finished job is one log line and one record in the metrics.

A finished job also gives freed heap pages back to the OS, at most every :data:`TRIM_EVERY_S`
(glibc's ``malloc_trim(0)``; nothing elsewhere). Without it a server's RSS crept up while the bytes
in use stayed flat: the decode thread's malloc arena kept the pages its varying per-cycle buffers
had freed (benchmarks/serve/leak_probe.py, docs/benchmarks.md "Soak").
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import itertools
import math
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from localflash.errors import LocalflashError
from localflash.serve.metrics import Metrics


TRIM_EVERY_S = 30.0  # seconds between two malloc_trim(0) calls (a finished job triggers one when due)


def heap_trimmer() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


class QueueFull(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


class CancelEvent(threading.Event):
    """A cancel flag that remembers when it was set and how many target passes had run by then."""

    def __init__(self):
        super().__init__()
        self.t_set: float | None = None
        self.cycles_at_set = 0
        self.live = None  # the running request's Stats (read only here)

    def set(self) -> None:
        if not self.is_set():
            self.t_set = time.perf_counter()
            self.cycles_at_set = self.live.cycles if self.live is not None else 0
        super().set()


_ids = itertools.count(1)


@dataclass
class Job:
    kind: str  # "chat" | "completion"
    prompt: Any  # messages (chat) or text (completion)
    params: dict
    loop: asyncio.AbstractEventLoop
    id: int = field(default_factory=lambda: next(_ids))
    cancel: CancelEvent = field(default_factory=CancelEvent)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    t_submit: float = field(default_factory=time.perf_counter)

    def emit(self, item: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            self.cancel.set()


class Worker:
    def __init__(self, llm, max_queue: int, metrics: Metrics, log: Callable[[str], None] | None = None):
        self.llm = llm
        self.n_slots = getattr(llm, "n_slots", 1)
        self.max_queue = max_queue
        self.metrics = metrics
        self.log = log or _log
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.waiting = 0
        self.slots: dict[int, Job] = {}  # slot -> the job running on it
        self.mean_seconds = 1.0  # moving average of a request's service time (Retry-After)
        self.busy_since: float | None = None  # some slot has been busy since then
        self.busy_seconds = 0.0  # wall time with at least one request running (aggregate throughput)
        self.trim = heap_trimmer()
        self.trimmed_at = time.perf_counter()
        self.trims = 0  # malloc_trim calls so far
        self.threads = [threading.Thread(target=self._loop, args=(i,), name=f"localflash-worker-{i}", daemon=True)
                        for i in range(self.n_slots)]
        self.thread = self.threads[0]

    @property
    def running(self) -> Job | None:
        """A running job (the only one with one slot)."""
        return next(iter(self.slots.values()), None)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.waiting >= self.max_queue and len(self.slots) + self.waiting >= self.n_slots:
                per_slot = self.mean_seconds * (self.waiting + 1) / self.n_slots
                raise QueueFull(max(1, math.ceil(per_slot)))
            self.waiting += 1
        self.jobs.put(job)

    def depth(self) -> tuple[int, int]:
        """(running, queued)."""
        with self.lock:
            return len(self.slots), self.waiting

    def busy_time(self) -> float:
        """Seconds during which at least one request was running (so far)."""
        with self.lock:
            return self.busy_seconds + (time.perf_counter() - self.busy_since if self.busy_since is not None else 0.0)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what runs and waits, end the threads."""
        with self.lock:
            for job in self.slots.values():
                job.cancel.set()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                with self.lock:
                    self.waiting -= 1
                job.cancel.set()
                job.emit(("error", LocalflashError("the server is shutting down")))
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            if t.is_alive():
                t.join(timeout)

    def _loop(self, thread: int) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            with self.lock:  # one thread per slot: a free slot exists; take the one whose cache fits this prompt best
                self.waiting -= 1
                free = [i for i in range(self.n_slots) if i not in self.slots]
                slot = self.llm.slot_for(job.prompt, free, **job.params) if self.n_slots > 1 else 0
                self.slots[slot] = job
                if self.busy_since is None:
                    self.busy_since = time.perf_counter()
            try:
                self._serve(job, slot)
            finally:
                with self.lock:
                    del self.slots[slot]
                    if not self.slots and self.busy_since is not None:
                        self.busy_seconds += time.perf_counter() - self.busy_since
                        self.busy_since = None
                    due = self.trim is not None and time.perf_counter() - self.trimmed_at >= TRIM_EVERY_S
                    if due:
                        self.trimmed_at = time.perf_counter()
                if due:
                    self.trim(0)  # the freed heap pages go back to the OS (see the module docstring)
                    self.trims += 1

    def _serve(self, job: Job, slot: int = 0) -> None:
        if job.cancel.is_set():
            job.emit(("done", None))
            self.log(f"#{job.id} {job.kind}: client left while queued, skipped")
            return
        t0 = time.perf_counter()
        last = None
        outcome = ""
        try:
            on = {"slot": slot} if self.n_slots > 1 else {}
            gen = self.llm.stream(job.prompt, cancel=job.cancel, **job.params, **on)  # checks everything before decoding
            job.cancel.live = getattr(gen, "stats", None)
            job.emit(("started", None))
            for chunk in gen:
                if job.cancel.live is None:
                    job.cancel.live = chunk.stats
                last = chunk
                job.emit(("chunk", chunk))
            job.emit(("done", last))
        except LocalflashError as e:
            outcome = f"refused: {e.message}"
            job.emit(("error", e))
        except Exception as e:  # a bug: the client gets a plain 500, the log gets the traceback
            outcome = f"failed: {type(e).__name__}: {e}"
            self.log(traceback.format_exc().rstrip())
            job.emit(("error", e))
        t_end = time.perf_counter()
        dt = t_end - t0
        self.mean_seconds = 0.8 * self.mean_seconds + 0.2 * dt
        if last is None:
            self.log(f"#{job.id} {job.kind}: {outcome or 'no output'} ({dt:.2f} s)")
            return
        st, reason = last.stats, last.finish_reason or "stop"
        self.metrics.record(st, last.prompt_tokens, last.cached_tokens, reason, slot)
        where = f" slot {slot}" if self.n_slots > 1 else ""
        line = (f"#{job.id}{where} {job.kind}: prompt {last.prompt_tokens} tok (cached {last.cached_tokens}), "
                f"generated {st.generated} tok @ {st.decode_tps:.1f} tok/s")
        if st.drafter != "none":
            line += f", {st.drafter} τ {st.tau:.2f} ({st.accepted}/{st.drafted})"
        if st.kv_wait:
            line += f", waited {st.kv_wait:.2f} s for KV room"
        if st.kv_evicted:
            line += f", evicted {st.kv_evicted} idle cached tok"
        line += f", {reason}, {dt:.2f} s"
        if reason == "cancelled" and job.cancel.t_set is not None:
            live = job.cancel.live  # the figures the cancel was counted on (a slot pool's own: the last chunk's may lag them)
            after = (live.cycles if live is not None else st.cycles) - job.cancel.cycles_at_set
            line += f"; client left: stopped {after} cycle(s), {1000 * (t_end - job.cancel.t_set):.0f} ms after"
        self.log(line)


def _log(line: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"{stamp} {line}", file=sys.stderr, flush=True)
