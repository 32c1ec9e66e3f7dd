"""Flat rows (top-k off, top-p keeping 50-99% of the vocabulary) draw exactly the book's token, without its sort.

Every test compares against :func:`reference_sample` (a full sort of the
vocabulary, then llama.cpp's chain) for the same ``u``, and checks that the
token came from the flat path (``sample_flat`` answered, or the Sampler's
``paths`` say ``flat``), so the book never serves the comparison silently.
"""

from __future__ import annotations

import numpy as np
import pytest

from localflash.speculative.sampling import (
    Sampler,
    SamplingParams,
    reference_distribution,
    reference_sample,
    sample_unfiltered,
)
from localflash.speculative.sampling_flat import sample_flat, slack

QWEN2_VOCAB, QWEN36_VOCAB = 151936, 248320


class _Fixed:
    """A generator that draws the given uniforms in turn."""

    def __init__(self, *us: float):
        self.us = list(us)

    def random(self) -> float:
        return self.us.pop(0)


def _flat_row(vocab: int, scale: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * scale).astype(np.float32)


def _kept_share(row: np.ndarray, p: SamplingParams) -> float:
    return len(reference_distribution(row, p)[0]) / len(row)


def _book_cumulative(row: np.ndarray, p: SamplingParams, tempered: bool) -> np.ndarray:
    """The book's running weights over its kept set (tempered: the draw's; else over the whole row: the cut's)."""
    vals = np.sort(row.astype(np.float64))[::-1]
    if tempered:
        vals = vals[: len(reference_distribution(row, p)[0])]
        return np.cumsum(np.exp((vals - vals[0]) / p.temperature))
    return np.cumsum(np.exp(vals - vals[0]))


@pytest.mark.parametrize("vocab", [QWEN2_VOCAB, QWEN36_VOCAB])
def test_flat_rows_draw_the_books_token(vocab):
    rng = np.random.default_rng(vocab)
    shares = []
    for seed, (scale, t, top_p) in enumerate([(0.3, 0.8, 0.95), (1.0, 1.5, 0.95), (0.7, 0.5, 0.8), (0.6, 1.0, 0.99),
                                              (1.0, 1.2, 0.9), (1.5, 0.7, 0.99)]):
        row = _flat_row(vocab, scale, seed)
        p = SamplingParams(t, 0, top_p)
        shares.append(_kept_share(row, p))
        for u in (*rng.random(3), 1e-7, 1 - 1e-9):
            tok, flat = sample_flat(row, p.top_p, p.min_p, p.temperature, u)
            assert flat and tok == reference_sample(row, p, u), (scale, t, top_p, u)
    assert min(shares) >= 0.5 and max(shares) <= 0.99, shares  # the rows are flat: top-p keeps most of them


def test_the_sampler_takes_the_flat_path_on_flat_rows_and_stays_exact():
    rng = np.random.default_rng(7)
    rows = [_flat_row(QWEN2_VOCAB, scale, seed) for seed, scale in enumerate((0.5, 1.0, 1.4))]
    for p in (SamplingParams(0.8, 0, 0.95), SamplingParams(1.0, 0, 0.9, 0.02), SamplingParams(0.7, 0, 1.0),
              SamplingParams(1.3, 0, 1.0, 0.01), SamplingParams(0.9, QWEN2_VOCAB, 0.95)):  # top-k >= V: off
        us = list(rng.random(2 * len(rows)))
        s = Sampler(p)
        s.rng = _Fixed(*us)
        got = [s(r) for r in rows + rows]  # the second pass: the last row was flat, no window first
        assert got == [reference_sample(r, p, u) for r, u in zip(rows + rows, us)], p
        assert s.paths == {"flat": 2 * len(rows)}, (p, s.paths)


def test_ties_at_the_cut_and_at_the_draw_go_by_id():
    """Logits rounded to 1/8: thousands of tokens share each value, the cut falls inside a tie group, and
    draws aimed at the kept set's last tokens land in it."""
    row = np.round(_flat_row(QWEN2_VOCAB, 1.0, 11) * 8) / 8
    p = SamplingParams(0.8, 0, 0.95)
    ids, _ = reference_distribution(row, p)
    edge = row[ids[-1]]
    assert np.count_nonzero(row[ids] == edge) < np.count_nonzero(row == edge)  # the cut splits a tie group
    cum = _book_cumulative(row, p, tempered=True)
    us = [cum[i] / cum[-1] * (1 + side * 1e-6) for i in (len(cum) - 2, len(cum) - 40, len(cum) // 2) for side in (-1, 1)]
    for u in us:
        tok, _ = sample_flat(row, p.top_p, p.min_p, p.temperature, u)
        assert tok == reference_sample(row, p, u), u
    assert {row[reference_sample(row, p, u)] for u in us[:2]} == {edge}  # the draws did land in the split group
    zeros = np.zeros(QWEN2_VOCAB, np.float32)  # every token tied: the book keeps the lowest ids
    for u in (0.0, 0.3, 0.999):
        tok, _ = sample_flat(zeros, 0.9, 0.0, 1.1, u)
        assert tok == reference_sample(zeros, SamplingParams(1.1, 0, 0.9), u)


def test_min_p_on_top_of_top_p_on_flat_rows():
    rng = np.random.default_rng(5)
    row = _flat_row(QWEN2_VOCAB, 1.3, 2)
    bound = 0
    for min_p in (0.001, 0.002, 0.02, 0.1):
        p = SamplingParams(1.2, 0, 0.95, min_p)
        bound += _kept_share(row, p) < _kept_share(row, SamplingParams(1.2, 0, 0.95))
        for u in rng.random(3):
            tok, _ = sample_flat(row, p.top_p, p.min_p, p.temperature, u)
            assert tok == reference_sample(row, p, u), (min_p, u)
    assert bound == 3  # min-p 0.002 (to 45% of the vocabulary), 0.02 and 0.1 cut the top-p set (64%), 0.001 does not
    for min_p in (0.01, 0.05):  # min-p alone
        p = SamplingParams(0.9, 0, 1.0, min_p)
        for u in rng.random(2):
            tok, _ = sample_flat(row, 1.0, min_p, 0.9, u)
            assert tok == reference_sample(row, p, u), (min_p, u)


def test_unfiltered_sampling_of_a_flat_row_takes_the_flat_path():
    row = _flat_row(QWEN36_VOCAB, 0.8, 3)
    for t, u in ((0.6, 0.25), (1.0, 0.5), (1.4, 0.97)):
        tok, how = sample_unfiltered(row, t, u)
        assert how == "flat" and tok == reference_sample(row, SamplingParams(t, 0, 1.0), u)


def test_a_decision_within_rounding_of_a_boundary_is_left_to_the_book():
    """``u * Z2`` or ``top_p * Z`` 1e-13 (relative) either side of one of the book's running weights: the flat
    path declines (its sums are not the book's), the Sampler sorts (``flat-open``) and gets the book's token;
    1e-8 away the flat path decides, and agrees."""
    row = _flat_row(QWEN2_VOCAB, 1.0, 4)
    assert 1e-13 < slack(QWEN2_VOCAB) < 1e-10
    p = SamplingParams(0.8, 0, 0.95)
    cum = _book_cumulative(row, p, tempered=True)
    z = _book_cumulative(row, p, tempered=False)
    cases = [(p, cum[i] / cum[-1] * (1 + side * eps)) for i in (100, 5000, len(cum) // 2) for side in (-1, 1)
             for eps in (1e-13, 1e-8)]
    cases += [(SamplingParams(0.8, 0, z[i] / z[-1] * (1 + side * eps)), 0.5) for i in (20000, 90000) for side in (-1, 1)
              for eps in (1e-13, 1e-8)]
    open_ = 0
    for q, u in cases:
        tok, _ = sample_flat(row, q.top_p, q.min_p, q.temperature, u)
        near = abs(u * cum[-1] - cum).min() < 1e-12 * cum[-1] if q is p else abs(q.top_p * z[-1] - z).min() < 1e-12 * z[-1]
        if near:
            assert tok is None
            open_ += 1
            s = Sampler(q)
            s.rng = _Fixed(u)
            assert s(row) == reference_sample(row, q, u) and s.paths == {"flat-open": 1}
        else:
            assert tok == reference_sample(row, q, u), (q, u)
    assert open_ == len(cases) // 2


@pytest.mark.parametrize("vocab", [QWEN2_VOCAB, QWEN36_VOCAB])
def test_logits_on_the_bin_edges_in_tie_groups_draw_the_books_token(vocab):
    """Every logit on or one float32 step either side of one of the 2,047 edges the bins are cut at
    (``top - k * range / 2046``), about 30 tokens tied on each value, the cut inside a tie group and draws aimed
    1e-6 (relative) either side of the book's running weights: neighbouring logits fall into different bins
    at the edges, and the book's order (by logit, then by id) must survive the binning."""
    rng = np.random.default_rng(vocab + 1)
    edges = (-np.arange(2047) * (4.0 / 2046)).astype(np.float32)
    values = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf))])
    values = values[(values <= 0) & (values >= -4)]
    row = values[rng.integers(0, len(values), vocab)]
    row[:2] = 0.0, -4.0  # the range: exactly [-4, 0]
    scaled = row.astype(np.float64) * -((2048 - 2) / 4.0)  # the module's bin arithmetic (top 0), before the floor
    assert np.abs(scaled - np.round(scaled)).max() < 1e-3  # every logit sits at an edge
    above, below = scaled[row == np.nextafter(edges[700], np.float32(np.inf))], scaled[row == np.nextafter(edges[700], np.float32(-np.inf))]
    assert np.floor(above[0]) != np.floor(below[0])  # an edge's float32 neighbours fall into different bins
    z = _book_cumulative(row, SamplingParams(0.8, 0, 0.95), tempered=False)
    ordered = np.sort(row)[::-1]
    r = int(np.searchsorted(z, 0.95 * z[-1]))
    group = np.flatnonzero(ordered == ordered[r])
    r = int(group[len(group) // 2])  # a cut in the middle of the tie group there: top-p just under z[r] / Z
    p = SamplingParams(0.8, 0, float(z[r] / z[-1] * (1 - 1e-9)))
    ids, _ = reference_distribution(row, p)
    assert len(ids) == r + 1
    edge = row[ids[-1]]
    assert np.count_nonzero(row[ids] == edge) < np.count_nonzero(row == edge)  # the cut splits a tie group
    cum = _book_cumulative(row, p, tempered=True)
    picks = (len(cum) - 2, len(cum) - 60, len(cum) // 3, 5)
    us = [cum[i] / cum[-1] * (1 + side * 1e-6) for i in picks for side in (-1, 1)]
    for u in us:
        tok, flat = sample_flat(row, p.top_p, p.min_p, p.temperature, u)
        assert flat and tok == reference_sample(row, p, u), u
    for i in (len(z) // 2, int(0.9 * len(z))):  # top-p cuts aimed 1e-6 either side of a running weight
        for side in (-1, 1):
            q = SamplingParams(1.3, 0, float(z[i] / z[-1] * (1 + side * 1e-6)))
            tok, _ = sample_flat(row, q.top_p, q.min_p, q.temperature, 0.999)
            assert tok == reference_sample(row, q, 0.999), (i, side)
