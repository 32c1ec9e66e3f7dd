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
        self.rng = np.random.default_rng(seed)
        self._refill()
        self.reference: list[int] = []  # prompt + the target's plain continuation
        self.right = 0  # draft tokens proposed as the reference token
        self.wrong = 0  # ... proposed as another token
        self.off_track = 0  # cycles whose history had left the reference (nothing proposed)
        self._same = 0  # leading history tokens known to equal the reference

    def set_reference(self, tokens: list[int]) -> None:
        """The prompt followed by what plain decoding wrote; restarts the draw sequence."""
        self.reference = list(tokens)
        self.rng = np.random.default_rng(self.seed)
        self._same = 0
        self._refill()

    def _refill(self, n: int = 4096) -> None:
        """Draw the next ``n`` per-token outcomes at once (a cycle then only slices lists: its cost is the loop's, not ours)."""
        ok = self.rng.random(n) < self.accept
        self._ok = ok.tolist()
        self._ok_sum = [0] + np.cumsum(ok).tolist()  # right drafts among the first i outcomes: no sum per cycle
        self._shift = self.rng.integers(1, self.n_vocab, size=n).tolist()
        self._n_drawn = n
        self._next = 0

    def rollback(self, n_keep: int) -> None:
        if self.inner is not None:
            self.inner.rollback(n_keep)

    def on_target_decode(self, target_ctx, start_pos: int, n_committed: int) -> None:
        if self.inner is not None:
            self.inner.on_target_decode(target_ctx, start_pos, n_committed)

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
        truth = ref[n : n + k]
        m = k if n + k <= n_ref else n_ref - n
        if self._next + m > self._n_drawn:
            self._refill()
        i, j = self._next, self._next + m
        self._next = j
        draft = [t if ok else (t + s) % self.n_vocab for t, ok, s in zip(truth, self._ok[i:j], self._shift[i:j])]
        right = self._ok_sum[j] - self._ok_sum[i]
        self.right += right
        self.wrong += m - right
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
