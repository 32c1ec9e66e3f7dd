"""Parallel slots: N requests on one target context, every active one in each target decode.

A :class:`SlotPool` owns a target context made for N sequences and one :class:`SlotEngine` per slot. A slot engine is
an :class:`~localflash.speculative.loop.Engine` on a :class:`~localflash.llama.sequences.SeqView` (sequence i of the
shared context) with its own drafter, draft policy and cached tokens, so the session layer (stop strings, phases,
cancel) runs on it unchanged; only its ``generate`` differs: it hands the request to the pool's thread and yields what
that thread commits for it. The slots' drafters are driven a step at a time by one
:class:`~localflash.speculative.group.DrafterGroup`: DFlash's, a draft model's and MTP's sit on sequence i of one
shared drafter context, so every slot's drafts (and their intake of the target's rows) cost one decode for all slots,
not one per slot.

The pool's thread runs *steps*. A waiting request joins at a step boundary: its prompt is prefilled on its own
sequence in chunks (:class:`~localflash.speculative.prefill.PromptFill`, the one-slot engine's schedule), each chunk
one more part of a step's ``llama_decode``, so the decoding slots go on while it fills (continuous batching; see
:func:`~localflash.speculative.prefill.prefill_rows` for how many prompt rows a step takes). In a step every active
slot drafts ``min(k, its limit)`` tokens (``k`` chosen for the step as a whole by
:class:`~localflash.speculative.step_policy.StepPolicy`), one ``llama_decode`` carries ``[last] + draft`` of every
slot (just ``[last]`` where k is 0), each slot's rows are verified exactly as in the one-stream loop
(``verify_block``), and each slot's caches are cut back: first the cuts that need no decode (KV tails, recurrent
snapshots, right after the decode that made them), then those that restore a recurrent checkpoint and replay. A
finished or cancelled request frees its slot at the next step boundary.

*In the graph* (``--sample-in-graph``): each slot's sequence samples with a chain of its request's own settings and
seed, attached when the request takes the slot (:func:`~localflash.speculative.graph_sampler.slot_sampler`), and a
slot's verify reads its rows' ids (``SeqView.verify_sampled``) instead of their logits; a grammar request goes on the host.

*Unified KV* (``--kv-pool unified``): every slot draws cells from one pool of ``n_ctx``; a request is admitted once
its reservation fits, after dropping idle caches or waiting for room (:mod:`.kv_pool`). While some slot runs, idle
slots' caches wait in host memory, so they do not widen the running slots' attention (:mod:`.kv_park`).
"""

from __future__ import annotations

import threading
import time
import traceback

from localflash.errors import LocalflashError
from localflash.llama.sequences import SeqView
from localflash.speculative.group import DrafterGroup
from localflash.speculative.kv_park import KvPark
from localflash.speculative.kv_pool import KvPool, SlotRequest
from localflash.speculative.loop import Engine, check_prompt, verify_block
from localflash.speculative.prefill import JoiningPrompts, PromptFill
from localflash.speculative.grammar import finish, trim_draft
from localflash.speculative.graph_sampler import GraphSampler, slot_sampler
from localflash.speculative.stats import Stats
from localflash.speculative.step_policy import StepPolicy

BACKLOG = 8  # emits a slot may run ahead of its reader; a cancel is seen by the pool itself before every step


class SlotEngine(Engine):
    """One slot: an Engine on its sequence of the pool's context; requests run on the pool's thread."""

    def __init__(self, pool: "SlotPool", index: int, target, view: SeqView, drafter, adaptive: bool, draft_max):
        super().__init__(target, view, drafter, adaptive, draft_max, sample_in_graph=pool.in_graph)  # (_prefill reads no logits)
        self.pool = pool
        self.index = index
        self.calibrated = True  # the pool measures step costs (StepPolicy), not each slot
        self.request: SlotRequest | None = None
        self.last_reused = 0  # prompt tokens the last request took from this slot's cache
        # this slot's part of the pool's current step (SlotPool._step): where its rows start, its draft length cap,
        # its draft and its share of the drafter group's time
        self.n_past, self.limit, self.draft, self.n_draft, self.t_draft = 0, 0, [], 0, 0.0
        self.m, self.kept, self.t_cut = 0, 0, 0.0  # drafts accepted, where its cache ends, its share of the cuts' time

    def generate(self, prompt, max_tokens, sampling=None, stats=None, draft_max=None, cancel=None):
        st = stats if stats is not None else Stats()
        check_prompt(prompt, self.ctx.n_ctx, "a slot", "raise -c/--ctx, lower --parallel or shorten the prompt")
        req = SlotRequest(list(prompt), max_tokens, sampling, draft_max, cancel, self.target)
        if cancel is not None and hasattr(cancel, "live"):
            cancel.live = req.stats  # the pool's own figures (the caller's copy lags by the emits not read yet)
        self.pool.submit(self, req)
        try:
            while True:
                kind, value, snap = req.out.get()
                req.taken += 1
                self.pool.wake()  # the pool steps a slot again once its last tokens were taken
                st.__dict__.update(snap.__dict__)
                if kind == "tokens":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            req.cancelled = True  # a no-op once done; else the pool ends it at the next step boundary
            self.pool.wake()
            while not req.idle.wait(0.5) and self.pool.alive:
                pass

    def _prefill(self, prompt, st):
        return self.pool.call(lambda: Engine._prefill(self, prompt, st))

    def reset(self) -> None:
        self.pool.call(lambda: (self.pool.park.forget(self), Engine.reset(self)))


class SlotPool(JoiningPrompts):
    """N slots on one target context; see the module docstring.

    ``clock``: where the step costs the policy weighs come from (tests inject a cost model), as ``Engine.clock``.
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self, target, ctx, drafters: list, adaptive: bool = True, draft_max: int | None = None,
                 max_rows: int | None = None, n_ubatch: int = 512, group: DrafterGroup | None = None, exact: bool = False,
                 sample_in_graph: bool = False):
        self.target = target
        self.in_graph = sample_in_graph  # each slot's rows sampled by a chain of its own in the graph (graph_sampler.slot_sampler)
        self.ctx = ctx
        self.group = group or DrafterGroup(drafters)  # drafts and intakes of a whole step (speculative/group.py)
        self.n_ubatch = n_ubatch
        self.exact = exact  # batch-invariant numerics asked for (a joining prompt's chunks on a recurrent target go alone)
        self.slots = [SlotEngine(self, i, target, SeqView(ctx, i, n_ubatch), d, adaptive, draft_max) for i, d in enumerate(drafters)]
        top = self.slots[0].policy.max_draft
        rows = min(ctx.n_batch, ctx.n_outputs_max, max_rows or ctx.n_batch)
        self.policy = StepPolicy(top, adaptive, rows, shared_draft=self.group.shared_draft,
                                 draft_cost_grows=self.slots[0].policy.draft_cost_grows)
        self.calibrated = not (adaptive and top)
        self.steps = 0
        self.rows_decoded = 0
        self.most_active = 0  # the most slots one step decoded together
        self.decodes = 0  # the target's batched decodes (steps and joining prompts' chunks: llama-server's n_decode_total)
        self.slot_decodes = 0  # summed over them, the slots each carried (/ decodes: llama-server's n_busy_slots_per_decode)
        self._calls: list = []
        self._joining: list[SlotEngine] = []
        self.unified = bool(getattr(ctx, "kv_unified", False)) and len(drafters) > 1
        self.recurrent = self.slots[0].ctx.recurrent  # (every slot's view is of the one target)
        self.kv = KvPool(self, ctx.n_ctx, len(drafters))  # the unified pool's admission (kv_pool.py); idle with split streams
        self.park = KvPark(self)  # idle slots' caches in host memory while others run (kv_park.py; unified, attention only)
        self._cv = threading.Condition()
        self._closing = False
        self.alive = True
        self._thread = threading.Thread(target=self._loop, name="localflash-slots", daemon=True)
        self._thread.start()

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    # -- the callers' side (any thread) ------------------------------------------
    def submit(self, slot: SlotEngine, req: SlotRequest) -> None:
        with self._cv:
            if not self.alive:
                raise LocalflashError("the slot pool is closed")
            if slot.request is not None:
                raise LocalflashError(f"slot {slot.index} is busy")
            slot.request = req
            self._joining.append(slot)
            self._cv.notify()

    def call(self, fn):
        """Run ``fn`` on the pool's thread between steps and return its result (or raise its error)."""
        if threading.current_thread() is self._thread:
            return fn()
        box: dict = {}
        done = threading.Event()
        with self._cv:
            if not self.alive:
                raise LocalflashError("the slot pool is closed")
            self._calls.append((fn, box, done))
            self._cv.notify()
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def describe(self) -> list[dict]:
        """What each slot is doing (read without stopping the pool: figures are a moment's)."""
        out = []
        for s in self.slots:
            req = s.request
            st = req.stats if req is not None else None
            state = "idle" if req is None else ("kv_wait" if req.t_kv_wait and req.state == "waiting" else
                                                "prefill" if req.state in ("waiting", "prefill") else "decoding")
            d = {"id": s.index, "state": state, "n_cached": len(s.tokens), "n_ctx": s.ctx.n_ctx,
                 "drafter": s.drafter.name if s.policy.max_draft else "none", "kv_pool": "unified" if self.unified else "split",
                 "n_reused": s.last_reused, "kv_parked": s.index in self.park.blobs}
            if st is not None:
                d.update(kv_reserved=req.kv_need, kv_evicted=st.kv_evicted, prompt_tokens=len(req.prompt), prompt_done=req.fill.done if req.fill is not None else 0, generated=st.generated, max_tokens=req.max_tokens, tau=round(st.tau, 3),
                         drafted=st.drafted, accepted=st.accepted, t_prefill=round(st.t_prefill, 4),
                         t_decode=round(self.clock() - req.t_start, 4) if req.t_start else 0.0)
            out.append(d)
        return out

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(30)
        self.group.close()
        self.ctx.close()

    # -- the pool's thread ----------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._calls or self._joining or self._ready() or self._filling() or self._closing or self._cancelled()
                                 or self.kv.retry):
                        self._cv.wait()
                    if self._closing:
                        break
                    calls, self._calls = self._calls, []
                for fn, box, done in calls:
                    try:
                        box["value"] = fn()
                    except BaseException as e:  # noqa: BLE001 (handed to the caller)
                        box["error"] = e
                    done.set()
                self._reap()
                with self._cv:
                    joining, self._joining = self._joining, []
                if self.unified:
                    self.kv.waiting += joining
                    self.kv.admit_waiting(self._admit, self._finish)
                else:
                    for slot in joining:
                        self._guarded([slot], lambda slot=slot: self._admit(slot))
                active, filling = self._ready(), self._filling()
                if active or filling:
                    if self.park.pending:
                        self._guarded([], self.park.park_idle)
                    self._guarded(active + filling, lambda: self._step(active, filling))
        finally:
            with self._cv:
                self.alive = False
                calls, self._calls = self._calls, []
            for s in self.slots:
                if s.request is not None:
                    self._finish(s, error=LocalflashError("the server is shutting down"))
            for _fn, box, done in calls:
                box["error"] = LocalflashError("the slot pool is closed")
                done.set()

    def _ready(self) -> list[SlotEngine]:
        """Decoding slots whose caller is at most BACKLOG emits behind (a slow reader holds back only its own slot)."""
        return [s for s in self.slots if s.request is not None and s.request.state == "decode" and s.request.emitted - s.request.taken < BACKLOG]

    def _filling(self) -> list[SlotEngine]:
        """Slots whose request's prompt is going in (a chunk in each step)."""
        return [s for s in self.slots if s.request is not None and s.request.state == "prefill"]

    def _cancelled(self) -> bool:
        for s in self.slots:  # (a loop: a generator costs a call per slot, and this runs before every step)
            if (req := s.request) is not None and (req.cancelled or (req.cancel is not None and req.cancel.is_set())):
                return True
        return False

    def _guarded(self, slots, fn) -> None:
        """Run ``fn``; on an error, end these slots' requests with it and forget their caches."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            if not isinstance(e, LocalflashError):
                traceback.print_exc()
            for s in slots:
                if s.request is not None:
                    self._finish(s, error=e)
                try:
                    Engine.reset(s)
                except Exception:  # noqa: BLE001 (the cache is gone either way)
                    s.tokens.clear()

    def _reap(self) -> None:
        for s in self.slots:
            req = s.request
            if req is not None and (req.cancelled or (req.cancel is not None and req.cancel.is_set())):
                with self._cv:
                    if s in self._joining:
                        self._joining.remove(s)
                if s in self.kv.waiting:
                    self.kv.waiting.remove(s)
                self._finish(s)

    def _finish(self, slot: SlotEngine, error: Exception | None = None) -> None:
        req = slot.request
        st = req.stats
        if req.t_start:
            st.t_decode = self.clock() - req.t_start
            view = slot.ctx
            st.rollback = view.rollback_path
            st.snapshot_rollbacks += view.counts["snapshot"] - req.counts0["snapshot"]
            st.checkpoint_restores += view.counts["restore"] - req.counts0["restore"]
        finish(req.sample, st)  # a grammar's counts and state
        slot.request = None
        self.kv.used(slot, freed=True)
        self.park.pending = self.park.on
        if error is not None:
            req.emit("error", error)
        else:
            req.emit("done")
        req.idle.set()

    def _calibrate(self, slot: SlotEngine) -> None:
        """Time decodes of 1 .. max_rows rows on ``slot``'s empty sequence (once), then drop them."""
        view = slot.ctx
        n = self.n_slots
        sizes = sorted({1, 2, n, 2 * n, *(n * (k + 1) for k in (1, 2, 4, 8, 16) if k <= self.policy.max_draft),
                        n * (self.policy.max_draft + 1)})
        sizes = [s for s in sizes if s <= min(self.policy.max_rows, view.n_ctx - 1)]
        Engine.reset(slot)
        for size in sizes:
            best = float("inf")
            for _ in range(2):
                t = self.clock()
                view.decode([self.target.bos] * size, 0, "all")
                view.logits(0)
                best = min(best, self.clock() - t)
                view.clear()
            self.policy.record(size, best)
        self.calibrated = True

    def _admit(self, slot: SlotEngine) -> None:
        """Let a joining request in: the cache cut back to the part of its prompt it reuses, its prefill begun."""
        req = slot.request
        if req is None or req.cancelled:
            return
        st = req.stats
        self.park.restore(slot, req)  # a parked cache back in the pool (or forgotten) before its prefix is reused
        if not self.calibrated:
            t_cal = self.clock()
            self._calibrate(slot)
            st.t_calibrate = self.clock() - t_cal  # the pool's one-off cost, paid by the request that met it
        st.drafter = slot.drafter.name if slot.policy.max_draft else "none"
        req.sample = slot_sampler(slot.ctx, req.sample, self.in_graph)
        st.sampled_in = "graph" if isinstance(req.sample, GraphSampler) else "host"
        req.t_fill = self.clock()
        req.counts0 = dict(slot.ctx.counts)
        req.fill = PromptFill(slot, req.prompt, st)
        slot.last_reused = st.cached_tokens
        self.kv.used(slot)
        req.state = "prefill"

    def _step(self, active: list[SlotEngine], filling: list[SlotEngine] = ()) -> None:
        """One batched draft–verify cycle over every active slot (``filling``: joining prompts riding along).

        Each slot's part of the step is kept on the slot (``n_past``, ``limit``, ``draft``, ...) and read by list
        comprehensions: a slot costs its verify, its cut and its commit, and the step's own work is done once."""
        plans = []
        for s in active:
            req = s.request
            n_past = len(s.tokens)
            room = s.ctx.n_ctx - n_past - 1
            if room < 0:
                req.stats.stop = "context"
                self._finish(s)
                continue
            top = s.policy.max_draft
            limit = req.max_tokens - req.stats.generated - 1  # the least of the reply's budget, the room, the caps
            limit = room if room < limit else limit
            limit = top if top < limit else limit
            if req.draft_max is not None and req.draft_max < limit:
                limit = req.draft_max
            if limit < 0 or not (s.drafting and n_past + 1 + top <= s.drafter.ctx_limit):
                limit = 0
            s.n_past, s.limit, s.draft, s.n_draft, s.t_draft = n_past, limit, [], 0, 0.0
            plans.append(s)
        filling = self._fill_alone(filling)
        if not plans:
            self._decode_with_fills([], filling)
            return
        k = self.policy.choose([(s.policy, s.limit) for s in plans])
        if self.policy.probe_slot is not None:  # a probe drafts on one slot, not on all (step_policy.py)
            for j, s in enumerate(plans):
                s.limit = s.limit if j == self.policy.probe_slot else 0
        asking = [s for s in plans if s.limit] if k else []
        t_group = 0.0  # the drafter group's time in this step (its drafts and its intake of what they committed)
        if asking:  # every drafting slot's draft from one group call (DFlash: one decode), its time shared out
            td = self.clock()
            drafts = self.group.propose([(s.index, s.request.history, s.n_past, k if k < s.limit else s.limit) for s in asking])
            t_group = t_propose = self.clock() - td
            share = t_group / len(asking)
            for s, draft in zip(asking, drafts):
                s.draft = trim_draft(s.request.sample, draft) if s.request.constrained else draft  # cut at a grammar's first reject
                s.n_draft, s.t_draft = len(s.draft), share
                if self.recurrent and s.n_draft > s.ctx.n_rs_seq:
                    s.ctx.checkpoint(transient=True)  # no snapshot reaches back (qwen3next): restore + replay on a miss
        tv = self.clock()
        prompt_rows = self._decode_with_fills([(s.ctx, [s.request.last] + s.draft, s.n_past, bool(s.draft)) for s in plans], filling)
        is_eog = self.target.is_eog
        verified = [verify_block(s.ctx, s.draft, s.request.sample, is_eog) for s in plans]
        t_decode = self.clock() - tv
        rows = len(plans) + sum([s.n_draft for s in plans])
        if not prompt_rows:  # the step costs by rows are of steps alone
            self.policy.record(rows, t_decode)
        self.steps += 1
        self.rows_decoded += rows
        if len(plans) > self.most_active:
            self.most_active = len(plans)
        for s, new in zip(plans, verified):
            s.m = m = len(new) - 1  # drafts accepted
            s.tokens += [s.request.last] + s.draft[:m]
            s.kept, s.t_cut = s.n_past + 1 + m, 0.0  # where its cache must end
        # cuts that need no decode first, right after the decode whose rows (snapshots, layer inputs) they use, then
        # every such slot's drafter takes in its committed rows in one group call; then the cuts that replay (a
        # target decode of that slot alone), each followed by its own drafter's intake. A batch's cut time is
        # shared out among the slots it cut.
        quick = [s for s in plans if s.ctx.rollback_ok(s.kept)] if self.recurrent else plans
        for batch in [quick] + [[s] for s in plans if s not in quick]:
            cut = [s for s in batch if s.m < s.n_draft]  # a draft token was rejected
            if cut:
                t0 = self.clock()
                for s in cut:
                    if batch is quick:
                        s.ctx.seq_rm(s.kept, -1, True)  # (Engine._cut's rewind, already known to be a plain cut)
                    else:
                        s._cut(s.kept)
                share = (self.clock() - t0) / len(cut)
                for s in cut:
                    s.t_cut = share
            if batch:
                td = self.clock()
                self.group.on_target_decode([(s.index, s.ctx, s.n_past, s.m + 1) for s in batch])
                share = self.clock() - td
                t_group += share
                share /= len(batch)
                for s in batch:
                    s.t_draft += share
        if asking:  # a shared drafter's decodes carry every drafting slot: the step waits for them whole (step_policy.py)
            self.policy.record_draft(min(k, max([s.limit for s in asking])), t_group)  # (the longest draft asked)
            if self.policy.probing and not prompt_rows:
                self.policy.record_probe(len(plans), t_propose + t_decode)  # (intake: every step pays it, probe or not)
        for s, new in zip(plans, verified):
            self._commit(s, new, t_decode + s.t_cut)

    def _commit(self, s: SlotEngine, new: list[int], t_target: float) -> None:
        """Slot ``s``'s verified tokens ``new`` (its step's ``draft``, ``m`` accepted) into its request and policy."""
        req, st, m, t_draft = s.request, s.request.stats, s.m, s.t_draft
        s.policy.record(s.n_draft, m, t_target, t_draft)
        st.record_cycle(s.n_draft, m, m + 1)
        st.t_target += t_target
        st.t_draft += t_draft
        req.last = last = new[-1]
        req.history += new
        n = m + 1
        if self.target.is_eog(last):
            new, n = new[:-1], m
            st.stop = "eog"
        left = req.max_tokens - st.generated
        if n > left:
            new, n = new[:left], left
        st.generated += n
        if n:
            req.emit("tokens", new)
        if not st.stop and st.generated >= req.max_tokens:
            st.stop = "length"
        if st.stop:
            self._finish(s)
