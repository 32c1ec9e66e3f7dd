"""BENCHMARK TOOL: an oracle drafter with a chosen per-token acceptance rate.

It knows the target's own plain continuation of the prompt (from a plain
pre-run with the same sampling settings and seed, set by the caller with
:meth:`SyntheticDrafter.set_reference`) and proposes it, each draft token
being the right one with probability ``accept`` (α) and a wrong one
otherwise. The target still verifies every token, so the output is the
target's own; only the acceptance is dialled in: with a fixed draft length
k, τ = 1 + α + α² + … + α^k. That measures the loop's speed ceiling at a
given τ on any hardware (llama.cpp's ``--spec-synth-rates`` serves the same
purpose, though it forces acceptance instead). Never a real drafter: it is
offered only as a ``bench`` mode, never by ``auto``.

``inner``: a real drafter whose costs to pay (feature injection, a block
forward) while its proposal is replaced — to time a DFlash cycle at τ ≈ 6
with random-weight models, which accept nothing on their own.
"""

from __future__ import annotations

import numpy as np

from localflash.speculative.drafter import Drafter
from localflash.speculative.group import DrafterGroup

LABEL = "synthetic acceptance (benchmark only: an oracle drafter, not a real one)"


class SyntheticDrafter(Drafter):
    cost_grows_with_length = False

    def __init__(self, accept: float, max_draft: int, n_vocab: int, seed: int = 0, inner: Drafter | None = None):
        if not 0.0 <= accept <= 1.0:
            raise ValueError(f"synthetic acceptance must be in [0, 1], got {accept}")
        self.accept = accept
        self.max_draft = max_draft
        self.n_vocab = n_vocab
        self.seed = seed
        self.inner = inner
        self.name = f"synthetic@{accept:g}"
        if inner is not None:
            self.ctx_limit = inner.ctx_limit
            # the inner drafter's own hooks, called straight (no frame of ours between the loop and them)
            self.rollback, self.on_target_decode = inner.rollback, inner.on_target_decode
        self.reference: list[int] = []  # prompt + the target's plain continuation
        self._drafts: list[int] = []  # what is proposed for each reference position (set_reference)
        self._ok_sum = [0]  # right proposals among reference positions 0..i-1
        self.right = 0  # draft tokens proposed as the reference token
        self.wrong = 0  # ... proposed as another token
        self.off_track = 0  # cycles whose history had left the reference (nothing proposed)
        self._same = 0  # leading history tokens known to equal the reference

    def set_reference(self, tokens: list[int]) -> None:
        """The prompt followed by what plain decoding wrote; draws every position's outcome afresh from ``seed``.

        Each reference position gets one draw: right with probability α, else the reference token shifted
        by a random non-zero amount. A proposal is then one slice of these (its cost is the loop's, not
        ours). Proposing a position again in a later cycle reuses its draw, which keeps the outcomes
        independent: a cycle reads its positions only up to the first wrong one, and the next cycle
        starts just after that one (the target's own token replaces it), on positions never read.
        """
        self.reference = ref = list(tokens)
        rng = np.random.default_rng(self.seed)
        ok = rng.random(len(ref)) < self.accept
        shift = rng.integers(1, self.n_vocab, size=len(ref))
        truth = np.asarray(ref, dtype=np.int64)
        self._drafts = np.where(ok, truth, (truth + shift) % self.n_vocab).tolist()
        self._ok_sum = [0] + np.cumsum(ok).tolist()
        self._same = 0

    def rollback(self, n_keep: int) -> None:
        pass

    def on_target_decode(self, target_ctx, start_pos: int, n_committed: int) -> None:
        pass

    def on_prompt(self, prompt: list[int]) -> None:
        self._same = 0  # a new request: its history is compared afresh
        if self.inner is not None:
            self.inner.on_prompt(prompt)

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        if k > self.max_draft:
            k = self.max_draft
        if self.inner is not None:
            self.inner.propose(history, n_past, k)  # its cost, not its tokens
        return self.oracle(history, k)

    def oracle(self, history: list[int], k: int) -> list[int]:
        """The proposal itself (``k`` <= max_draft): the reference's next tokens, each right with probability α."""
        n, ref = len(history), self.reference
        n_ref = len(ref)
        if self._same < n <= n_ref and history[self._same : n] == ref[self._same : n]:
            self._same = n  # the history only grows within a request: compare what is new
        if k <= 0 or self._same != n or n >= n_ref:
            self.off_track += k > 0 and self._same != n
            return []
        draft = self._drafts[n : n + k]
        right = self._ok_sum[n + len(draft)] - self._ok_sum[n]
        self.right += right
        self.wrong += len(draft) - right
        return draft

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


class SyntheticGroup(DrafterGroup):
    """Slots' synthetic drafters (``drafters[i]``'s inner is slot i's drafter of ``inner``, a real group): each
    step phase is the real group's (one DFlash decode for every slot), then each slot's proposal is replaced."""

    def __init__(self, drafters: list[SyntheticDrafter], inner: DrafterGroup):
        super().__init__(drafters)
        self.inner = inner
        self.shared_draft = inner.shared_draft

    def propose(self, asks):
        self.inner.propose(asks)  # its cost, not its tokens
        drafters = self.drafters
        return [drafters[i].oracle(history, k if k < drafters[i].max_draft else drafters[i].max_draft)
                for i, history, _n_past, k in asks]

    def on_target_decode(self, taken) -> None:
        self.inner.on_target_decode(taken)

    def close(self) -> None:
        self.inner.close()
