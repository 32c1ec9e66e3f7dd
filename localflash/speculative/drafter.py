"""The small interface every drafter implements, and the n-gram (prompt lookup) drafter."""

from __future__ import annotations

import numpy as np


class Drafter:
    """Proposes tokens that the target then verifies in one pass.

    The engine calls, in order: :meth:`rollback` when a request reuses part of
    the cached context, :meth:`on_target_decode` after every target decode
    with the number of its rows that are now committed, and :meth:`propose`
    once per cycle. Drafters never decide what is emitted; the target does.
    """

    name = "none"
    max_draft = 0
    cost_grows_with_length = True  # False when one forward drafts the whole block (DFlash)
    ctx_limit = 1 << 30  # positions the drafter's own cache can hold; past it, no drafting

    def rollback(self, n_keep: int) -> None:
        """Forget everything at positions >= ``n_keep``."""

    def on_target_decode(self, target_ctx, start_pos: int, n_committed: int) -> None:
        """Rows ``[0, n_committed)`` of the target's last decode are committed at ``start_pos..``."""

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``history`` (whose last token sits at position ``n_past``)."""
        return []

    def close(self) -> None:
        """Release the drafter's model and context."""


class NgramDrafter(Drafter):
    """Prompt lookup: continue the most recent earlier occurrence of the current suffix.

    Tries suffix lengths ``max_ngram`` down to ``min_ngram``; costs no model pass,
    so it pays wherever output repeats the prompt (code edits, summaries, RAG).
    """

    name = "ngram"
    cost_grows_with_length = False

    def __init__(self, max_draft: int = 8, max_ngram: int = 4, min_ngram: int = 2, window: int = 4096):
        self.max_draft = max_draft
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = window

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        if k <= 0:
            return []
        hist = np.asarray(history[-self.window :], dtype=np.int64)
        n = len(hist)
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            suffix = hist[n - size :]
            # candidate starts s: hist[s:s+size] == suffix, with s+size < n (something follows)
            windows = np.lib.stride_tricks.sliding_window_view(hist[: n - 1], size)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + size
                return hist[start : start + k].tolist()
        return []
