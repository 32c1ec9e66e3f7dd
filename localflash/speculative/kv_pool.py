"""Admission to a unified KV pool: parallel slots whose sequences draw cells from one cache of ``n_ctx`` cells.

With ``kv_unified`` (``--kv-pool unified``) llama.cpp gives any sequence any free cell, so one slot
may hold a sequence up to the whole context; what must hold is that the slots together fit. The
:class:`~localflash.speculative.slots.SlotPool` asks :class:`KvPool` before a request's prefill
begins. A request *reserves* ``prompt + max_tokens + max_draft + 1`` cells (at most the pool): the
most its sequence can come to hold, a draft block's rows included, so a running request never meets
a full pool. It is admitted once its reservation fits beside the running requests' reservations
and the idle slots' cached conversations; if it does not, the least recently used idle caches are
dropped (``Stats.kv_evicted``), and if that is not enough it waits, first come first served,
until running requests finish (``Stats.kv_wait``; ``/slots`` shows it as ``kv_wait``). An idle
slot keeps its finished conversation's cells until they are needed, for the next turn that resends
it (the routing: ``LLM.slot_for``); while other slots run they wait in host memory (:mod:`.kv_park`),
holding no cells, and a request admitted to such a slot reserves the cells its cache takes back.
"""

from __future__ import annotations

import queue
import threading
import time

from localflash.speculative.grammar import ConstrainedSampler, host_sampler
from localflash.speculative.stats import Stats


class KvPool:
    """The unified pool's bookkeeping for one SlotPool (``capacity`` cells, ``n_slots`` slots)."""

    def __init__(self, slots_pool, capacity: int, n_slots: int):
        self.slots_pool = slots_pool
        self.capacity = capacity
        self.waiting: list = []  # slot engines whose request waits for room, first come first served
        self.used_at = [0.0] * n_slots  # when each slot's cache was last used (the eviction order)
        self.evictions = 0  # idle caches dropped to make room
        self.evicted_tokens = 0
        self.waits = 0  # requests that had to wait for room
        self.retry = False  # room came free while requests wait: the pool's loop tries them again

    def used(self, slot, freed: bool = False) -> None:
        """``slot``'s cache was used now; ``freed``: its request ended (room may have come free)."""
        self.used_at[slot.index] = time.monotonic()
        if freed:
            self.retry = bool(self.waiting)

    def reservation(self, slot, req) -> int:
        """Cells a request may come to hold: its prompt, its reply, a draft block's rows (at most the pool)."""
        return min(self.capacity, len(req.prompt) + req.max_tokens + slot.policy.max_draft + 1)

    def held(self, s) -> int:
        """Cells slot ``s`` holds or may come to hold: a running request's reservation, else its cached tokens."""
        req = s.request
        if req is not None and req.state in ("prefill", "decode"):
            return max(req.kv_need, len(s.tokens))
        return 0 if s.index in self.slots_pool.park.blobs else len(s.tokens)  # a parked cache holds no cells (kv_park.py)

    def in_use(self) -> int:
        return sum(self.held(s) for s in self.slots_pool.slots)

    def make_room(self, slot) -> bool:
        """Whether ``slot``'s request fits, after dropping least recently used idle caches if it must.

        A parked cache that the prompt would reuse is put back whole (all its cells) before the prefix reuse cuts it:
        where that does not fit and the request alone needs fewer cells, the cache is forgotten instead (kv_park.py)."""
        from localflash.speculative.loop import Engine

        req = slot.request
        park = self.slots_pool.park
        need, restore = self.reservation(slot, req), park.restore_cells(slot, req.prompt)  # (a restore takes all its cells)
        used = sum(self.held(s) for s in self.slots_pool.slots if s is not slot)
        if used + max(need, restore) <= self.capacity:
            return True
        if restore > need:  # its parked cache would take back cells the prompt leaves behind (it shares only a prefix):
            park.forget(slot)  # prefill the prompt rather than evict other conversations or wait for room to put it back
            self.evicted(restore, req)
            if used + need <= self.capacity:
                return True
        # idle slots first (oldest first), then the stale caches of requests that wait behind this one
        parked = park.blobs  # (they hold no cells: dropping one makes no room)
        idle = sorted((s for s in self.slots_pool.slots if s is not slot and s.tokens and s.index not in parked
                       and (s.request is None or s in self.waiting)),
                      key=lambda s: (s.request is not None, self.used_at[s.index]))
        for s in idle:
            if used + need <= self.capacity:
                break
            n = len(s.tokens)
            Engine.reset(s)
            used -= n
            self.evicted(n, req)
        return used + need <= self.capacity

    def evicted(self, n: int, req=None) -> None:
        """A cached conversation of ``n`` tokens was dropped (to make room for ``req``, if given): counted."""
        self.evictions += 1
        self.evicted_tokens += n
        if req is not None:
            req.stats.kv_evicted += n

    def admit_waiting(self, admit, finish) -> None:
        """Admit waiting requests in arrival order while each fits (``admit(slot)`` begins its prefill; ``finish(slot, error=)``)."""
        self.retry = False
        while self.waiting:
            slot = self.waiting[0]
            req = slot.request
            if req is None or req.cancelled:
                self.waiting.pop(0)
                continue
            try:
                fits = self.make_room(slot)
            except Exception as e:  # noqa: BLE001 (a failed eviction ends this request, not the pool)
                self.waiting.pop(0)
                finish(slot, error=e)
                continue
            if not fits:
                if not req.t_kv_wait:
                    req.t_kv_wait = time.perf_counter()
                    self.waits += 1
                return
            self.waiting.pop(0)
            if req.t_kv_wait:
                req.stats.kv_wait = time.perf_counter() - req.t_kv_wait
            req.kv_need = self.reservation(slot, req)
            self.slots_pool._guarded([slot], lambda slot=slot: admit(slot))

    def describe(self) -> dict:
        """The pool as a whole: cells, what the slots hold or reserve, evictions and waits so far, parked caches (kv_park.py)."""
        return {"kv_pool": "unified", "n_cells": self.capacity, "in_use": self.in_use(), "waiting": len(self.waiting),
                "evictions": self.evictions, "evicted_tokens": self.evicted_tokens, "waits": self.waits} | self.slots_pool.park.describe()


class SlotRequest:
    """One request on a slot: its prompt, sampler, progress and the queue its caller reads."""

    def __init__(self, prompt, max_tokens, sampling, draft_max, cancel=None, target=None):
        self.cancel = cancel  # a threading.Event the caller may set: the request ends before the next step
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.sample = host_sampler(target, sampling)  # constrained when the request has a grammar
        self.constrained = isinstance(self.sample, ConstrainedSampler)  # (its drafts are cut at the grammar's first reject)
        self.draft_max = draft_max
        self.stats = Stats()
        self.out: queue.SimpleQueue = queue.SimpleQueue()  # (a put is one C call: no lock and condition in Python)
        self.emitted = self.taken = 0  # emits put and taken by the caller (each counted by its own thread alone)
        self.cancelled = False
        self.idle = threading.Event()  # set once the pool let go of the request (its slot is consistent)
        self.state = "waiting"  # waiting | prefill | decode
        self.fill: PromptFill | None = None  # while prefilling: the prompt's progress
        self.t_fill = 0.0
        self.history: list[int] = []
        self.last = -1
        self.t_start = 0.0
        self.counts0: dict = {}
        self.kv_need = 0  # cells reserved in a unified KV pool (set at admission)
        self.t_kv_wait = 0.0  # when it began to wait for room (0: it did not)

    def emit(self, kind: str, value=None) -> None:
        self.emitted += 1
        self.out.put((kind, value, self.stats.snapshot()))  # the figures as of this emit (the pool goes on updating its own)
