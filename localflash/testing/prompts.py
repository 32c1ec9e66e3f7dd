"""Deterministic word-salad prompts for the lossless tests on tiny random-weight models."""

from __future__ import annotations

import numpy as np

WORDS = "the river a garden of quiet stone light and paper over nine silver hills where we".split()


def word_prompts(n: int, seed: int = 0, repeat_every: int = 4, long_every: int = 5, long_times: int = 8) -> list[str]:
    """``n`` prompts of 3–11 words: every ``repeat_every``-th says itself three times (n-gram and
    lookup food), every ``long_every``-th is ``long_times`` times longer (crosses a small n_batch)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=int(rng.integers(3, 12))))
        if i % repeat_every == 0:
            words = words * 3
        if i % long_every == 0:
            words = words * long_times
        out.append(" ".join(words))
    return out
