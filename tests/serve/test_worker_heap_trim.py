"""The worker gives freed heap pages back (glibc ``malloc_trim(0)``) after finished jobs, at most every TRIM_EVERY_S.

A soak's RSS crept up while the server's C heap in use stayed flat: freed pages stayed in the
decode thread's malloc arena (benchmarks/serve/leak_probe.py). The worker now trims after a job
when the interval has passed. No model: a stand-in LLM whose stream yields nothing.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from localflash.serve import worker as W
from localflash.serve.metrics import Metrics


class NoModel:
    n_slots = 1

    def stream(self, prompt, cancel=None, **params):
        return iter(())


def _run_jobs(worker, n: int) -> None:
    loop = asyncio.new_event_loop()
    try:
        for i in range(n):
            job = W.Job("chat", f"p{i}", {}, loop)
            worker.submit(job)
            while worker.depth() != (0, 0) or not worker.jobs.empty():
                time.sleep(0.001)
    finally:
        worker.stop()
        loop.close()


@pytest.mark.parametrize("every, want", [(0.0, 5), (3600.0, 0)])
def test_finished_jobs_trim_the_heap_at_most_every_interval(monkeypatch, every, want):
    monkeypatch.setattr(W, "TRIM_EVERY_S", every)
    calls = []
    w = W.Worker(NoModel(), 8, Metrics(), log=lambda line: None)
    w.trim = lambda pad: calls.append(pad) or 1
    w.start()
    _run_jobs(w, 5)
    assert calls == [0] * want and w.trims == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_glibc_s_malloc_trim_is_found_and_callable():
    trim = W.heap_trimmer()
    assert trim is not None and trim(0) in (0, 1)
