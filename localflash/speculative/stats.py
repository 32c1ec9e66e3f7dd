"""What a generation did: tokens, target passes, drafts, acceptance and where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


# Why a generation ended (Stats.stop); the session/API layer maps eog and stop to finish_reason "stop".
STOP_REASONS = {
    "eog": "the model ended its reply",
    "length": "--max-tokens reached",
    "context": "the context is full",
    "stop": "a stop string came",
    "cancelled": "cancelled",
}


@dataclass
class Stats:
    drafter: str = "none"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the cache (set by the session layer)
    generated: int = 0  # tokens emitted to the user
    committed: int = 0  # tokens committed by decode cycles (bonus included)
    cycles: int = 0  # target forward passes after prefill
    drafted: int = 0
    accepted: int = 0
    accept_hist: list[int] = field(default_factory=list)  # [m] = cycles that accepted m drafts
    pos_tries: list[int] = field(default_factory=list)  # [j] = drafts offered at block position j
    pos_hits: list[int] = field(default_factory=list)
    rows: int = 0  # target rows verified by decode cycles (drafted + 1 per drafting cycle, 1 per plain step)
    tree_cycles: int = 0  # cycles that verified a branching tree (--tree)
    tree_nodes: int = 0  # drafted nodes of those trees
    t_prefill: float = 0.0
    t_calibrate: float = 0.0  # the adaptive draft length's one-off timing passes (an engine's first request), between prefill and decode
    t_decode: float = 0.0  # wall time of the decode phase (calibration excluded)
    t_target: float = 0.0  # target verify/decode passes
    t_draft: float = 0.0  # drafter proposals and feature injection
    stop: str = ""  # one of STOP_REASONS
    rollback: str = ""  # how the target cache went back: kv | snapshot (n_rs_seq) | replay (checkpoint + replay)
    snapshot_rollbacks: int = 0  # cuts served by recurrent-state snapshots
    checkpoint_restores: int = 0  # cuts served by restoring a recurrent-state checkpoint (then replay / re-prefill)
    grammar_calls: int = 0  # C calls into a request's grammar (mask, test, accept, clone): speculative/grammar.py
    grammar_rejected: int = 0  # draft tokens the grammar cut before verify
    t_grammar: float = 0.0  # host time in the grammar (masking, draft checks)
    kv_wait: float = 0.0  # seconds the request waited for room in a unified KV pool (parallel slots)
    kv_evicted: int = 0  # cached tokens of idle slots dropped from the unified KV pool to make room for it
    sampled_in: str = "host"  # where the target's rows were sampled: host (logits copied, localflash's Sampler) | graph (llama.cpp's chain, ids copied)

    def record_cycle(self, n_drafted: int, n_accepted: int, n_committed: int, depth: int | None = None, leaves: int = 1) -> None:
        """One cycle: ``n_drafted`` tokens (a tree's nodes, ``depth`` deep) of which ``n_accepted`` on the accepted path.

        ``pos_tries``/``pos_hits`` count by depth: a depth is tried when the walk reaches it.
        """
        self.cycles += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.committed += n_committed
        self.rows += n_drafted + 1
        if leaves > 1:
            self.tree_cycles += 1
            self.tree_nodes += n_drafted
        hist, tries, hits = self.accept_hist, self.pos_tries, self.pos_hits
        reached = n_drafted if depth is None else depth
        if n_accepted + 1 < reached:
            reached = n_accepted + 1
        try:  # the lists grow to the longest cycle once: then no call per position
            hist[n_accepted] += 1
        except IndexError:
            hist.extend([0] * (n_accepted + 1 - len(hist)))
            hist[n_accepted] += 1
        if len(tries) < reached:
            tries.extend([0] * (reached - len(tries)))
        for j in range(reached):
            tries[j] += 1
        hit = n_accepted if n_accepted < reached else reached
        if hit:
            if len(hits) < hit:
                hits.extend([0] * (hit - len(hits)))
            for j in range(hit):
                hits[j] += 1

    def snapshot(self) -> "Stats":
        """A copy whose lists are its own (the figures as of now; cheaper than copy.copy: a slot emits one a step)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.accept_hist, new.pos_tries, new.pos_hits = self.accept_hist[:], self.pos_tries[:], self.pos_hits[:]
        return new

    @property
    def tau(self) -> float:
        """Mean committed tokens per target pass (bonus token included)."""
        return self.committed / self.cycles if self.cycles else 0.0

    @property
    def tau_per_row(self) -> float:
        """Committed tokens per verified target row: what a pass buys where each row costs (a CPU)."""
        return self.committed / self.rows if self.rows else 0.0

    @property
    def mean_tree_nodes(self) -> float:
        return self.tree_nodes / self.tree_cycles if self.tree_cycles else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated / self.t_decode if self.t_decode > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.t_prefill if self.t_prefill > 0 else 0.0

    @property
    def t_host(self) -> float:
        return max(0.0, self.t_decode - self.t_target - self.t_draft)

    @property
    def position_acceptance(self) -> list[float]:
        hits = self.pos_hits + [0] * (len(self.pos_tries) - len(self.pos_hits))
        return [h / t if t else 0.0 for h, t in zip(hits, self.pos_tries)]

    def merge(self, other: "Stats") -> None:
        """Add another request's counts (cumulative session stats)."""
        for name in ("prompt_tokens", "cached_tokens", "generated", "committed", "cycles", "drafted", "accepted",
                     "snapshot_rollbacks", "checkpoint_restores", "rows", "tree_cycles", "tree_nodes",
                     "grammar_calls", "grammar_rejected"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("t_prefill", "t_calibrate", "t_decode", "t_target", "t_draft", "t_grammar"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("accept_hist", "pos_tries", "pos_hits"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for i, v in enumerate(theirs):
                _bump(mine, i, v)
        self.drafter = other.drafter
        self.stop = other.stop
        self.rollback = other.rollback
        self.sampled_in = other.sampled_in

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tau=self.tau,
            acceptance=self.acceptance,
            decode_tps=self.decode_tps,
            prefill_tps=self.prefill_tps,
            calibrate_ms=1000 * self.t_calibrate,
            t_host=self.t_host,
            host_ms_per_cycle=1000 * self.t_host / self.cycles if self.cycles else 0.0,
            host_share=self.t_host / self.t_decode if self.t_decode > 0 else 0.0,
            position_acceptance=self.position_acceptance,
            tau_per_row=self.tau_per_row,
            mean_tree_nodes=self.mean_tree_nodes,
        )
        return d

    def summary(self) -> str:
        line = (
            f"prompt {self.prompt_tokens} tok @ {self.prefill_tps:.1f} tok/s | "
            f"generated {self.generated} tok @ {self.decode_tps:.1f} tok/s"
        )
        if self.drafter != "none":
            line += f" | {self.drafter}: τ {self.tau:.2f}, accepted {self.accepted}/{self.drafted} ({100 * self.acceptance:.0f}%)"
            if self.tree_cycles:
                line += f", tree {self.mean_tree_nodes:.1f} nodes in {self.tree_cycles}/{self.cycles} cycles"
        if self.sampled_in == "graph":
            line += " | target rows sampled in the graph"
        if self.t_calibrate:
            line += f" | calibration {1000 * self.t_calibrate:.0f} ms (once per engine)"
        if self.rollback in ("snapshot", "replay"):
            line += f" | rollback {self.rollback}: {self.snapshot_rollbacks} snapshot, {self.checkpoint_restores} restore"
        return line


FAR_BELOW = 0.5  # a measured acceptance under half its reference is "far below" it
GUARD_MIN_DRAFTED = 64  # drafted tokens before the guard judges a run (fewer: noise)
GUARD_MIN_EXPECTED = 8  # and enough that the reference would have accepted this many (a 2% reference: 400 drafted)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def acceptance_guard(st: Stats, drafter_kv: str = "f16", target_kv: str = "f16", expected: float | None = None,
                     f16_acceptance: float | None = None, min_drafted: int = GUARD_MIN_DRAFTED, pair: str | None = None) -> str:
    """One line when the run's measured acceptance is far below a reference, naming which comparison fired, the
    likely cause and the fix; "" if not.

    References, checked in this order: the drafter's own acceptance with f16 caches (``f16_acceptance``) and the
    pair's expected value (``expected``, models.toml ``acceptance`` of ``pair``: measured with f16 caches,
    greedy, fixed draft length, benchmarks/drafter/kv_acceptance.py). A reference is judged only once the run
    drafted ``min_drafted`` tokens and enough that the reference would have accepted ``GUARD_MIN_EXPECTED``.
    The cause named: a quantized drafter cache first (upstream, a quantized draft cache took DFlash from 99% to
    0-2% acceptance, llama.cpp #25725), then a quantized target cache, else a drafter that does not fit the text.
    """
    if st.drafter == "none" or st.drafted < min_drafted:
        return ""
    where = f" (models.toml acceptance of pair {pair})" if pair else " (models.toml acceptance)"
    for ref, what in ((f16_acceptance, "its own acceptance with f16 caches"), (expected, "this pair's expected acceptance")):
        if ref and st.drafted * ref >= GUARD_MIN_EXPECTED and st.acceptance < FAR_BELOW * ref:
            break
    else:
        return ""
    got = (f"{st.drafter} acceptance {100 * st.acceptance:.1f}% ({st.accepted}/{st.drafted}) is far below {what} {_pct(ref)}"
           + (where if ref is expected else ""))
    if drafter_kv != "f16":
        return f"{got}: the drafter's {drafter_kv} KV cache is the likely cause; rerun with --kv-drafter f16"
    if target_kv != "f16":
        return f"{got}: the target's {target_kv} KV cache is the likely cause; rerun with --kv f16 (or q8_0)"
    return f"{got} with f16 caches: the drafter likely does not fit this target or this kind of text (localflash models check)"


def _bump(counts: list[int], i: int, by: int = 1) -> None:
    while len(counts) <= i:
        counts.append(0)
    counts[i] += by
