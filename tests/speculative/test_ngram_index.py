"""The indexed n-gram drafter proposes exactly what a scan of the window would."""

from __future__ import annotations

import numpy as np
import pytest

from localflash.speculative.drafter import NgramDrafter


def scan(history, k, max_ngram=4, min_ngram=2, window=4096):
    """The reference: search the window for the most recent earlier occurrence of the suffix."""
    hist = np.asarray(history[-window:], dtype=np.int64)
    n = len(hist)
    for size in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(hist[: n - 1], size)
        hits = np.flatnonzero((windows == hist[n - size :]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + size
            return hist[start : start + k].tolist()
    return []


@pytest.mark.parametrize("vocab,window,max_ngram,min_ngram", [(5, 4096, 4, 2), (3, 40, 4, 2), (12, 64, 3, 1), (50, 4096, 5, 3)])
def test_index_matches_scan_as_history_grows(vocab, window, max_ngram, min_ngram):
    rng = np.random.default_rng(vocab * 1000 + window)
    for case in range(20):
        d = NgramDrafter(8, max_ngram=max_ngram, min_ngram=min_ngram, window=window)
        history = rng.integers(0, vocab, size=int(rng.integers(1, 30))).tolist()
        for step in range(60):
            k = int(rng.integers(1, 9))
            assert d.propose(history, len(history) - 1, k) == scan(history, k, max_ngram, min_ngram, window), (case, step)
            history += rng.integers(0, vocab, size=int(rng.integers(1, 5))).tolist()  # the engine appends in place


def test_a_new_edited_or_shortened_history_rebuilds_the_index():
    d = NgramDrafter(8)
    a = [1, 2, 3, 9, 1, 2, 3]
    assert d.propose(a, 6, 4) == [9, 1, 2, 3]
    b = [1, 2, 3, 7, 1, 2, 3]  # a different list with the same length
    assert d.propose(b, 6, 4) == [7, 1, 2, 3]
    c = list(b)
    c[3] = 5  # an edited copy
    assert d.propose(c, 6, 4) == [5, 1, 2, 3]
    del c[4:]  # shortened in place
    c += [2, 3, 5]
    assert d.propose(c, len(c) - 1, 4) == scan(c, 4)
    d.on_prompt(a[:-1])  # the prompt indexed in prefill, then a longer history list
    assert d.propose(a + [9], 7, 4) == scan(a + [9], 4)
