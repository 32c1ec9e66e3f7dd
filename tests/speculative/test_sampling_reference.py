"""The production sampler against a book written here from scratch: llama.cpp's chain in plain Python floats.

The other sampling tests compare with ``sampling._book``, which shares ``_keep`` and ``_draw`` with
the paths under test; this one shares nothing with the package. Its reference sorts the whole row
(descending logit, ties by id), cuts top-k, then top-p on the cumulative sum of ``exp(x - top)``
(the first rank reaching ``top_p`` of the total) and min-p (weights of at least ``min_p``), then
tempers the kept logits; the token at a uniform ``u`` is the first kept rank whose cumulative tempered
weight exceeds ``u`` of the total. Every sum is a sequential loop over Python floats (float64).

Over a few hundred random rows (peaked, flat, with tied logits; 50 to 6,000 tokens) and settings
(temperature, top-k, top-p, min-p), the book (``reference_distribution``), the window path
(``filtered_distribution``), the flat path (``sample_flat``) and the :class:`Sampler` itself must give
the reference's ids (equal), probabilities (allclose) and token.
"""

from __future__ import annotations

import math

import numpy as np

from localflash.speculative.sampling import Sampler, SamplingParams, filtered_distribution, reference_distribution, reference_sample
from localflash.speculative.sampling_flat import sample_flat

TEMPERATURES = [0.3, 0.7, 1.0, 1.6]
TOP_K = [0, 0, 1, 3, 40]
TOP_P = [1.0, 1.0, 0.5, 0.9, 0.95]
MIN_P = [0.0, 0.0, 0.02, 0.1]


def book(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> tuple[list[int], list[float]]:
    """Kept ids in order and their tempered probabilities, by llama.cpp's chain on a full sort."""
    x = [float(v) for v in row]
    n = len(x)
    order = sorted(range(n), key=lambda i: (-x[i], i))
    if 0 < top_k < n:
        order = order[:top_k]
    top = x[order[0]]
    weights = [math.exp(x[i] - top) for i in order]
    keep = len(order)
    if top_p < 1.0:
        total = 0.0
        for w in weights:
            total += w
        acc = 0.0
        for j, w in enumerate(weights):
            acc += w
            if acc >= top_p * total:
                keep = min(keep, j + 1)
                break
    if min_p > 0.0:
        keep = min(keep, sum(1 for w in weights if w >= min_p))
    kept = order[:max(keep, 1)]
    tempered = [math.exp((x[i] - top) / temperature) for i in kept]
    z = 0.0
    for t in tempered:
        z += t
    return kept, [t / z for t in tempered]


def draw(row: np.ndarray, kept: list[int], temperature: float, u: float) -> int:
    """The kept token at ``u``: the first whose cumulative tempered weight exceeds ``u`` of the total."""
    top = float(row[kept[0]])
    weights = [math.exp((float(row[i]) - top) / temperature) for i in kept]
    total = 0.0
    for w in weights:
        total += w
    acc = 0.0
    for i, w in zip(kept, weights):
        acc += w
        if acc > u * total:
            return i
    return kept[-1]


class _Fixed:
    """A generator that draws the given uniform."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def rows(rng: np.random.Generator, count: int):
    for r in range(count):
        n = int(rng.choice([50, 300, 2000, 6000]))
        scale = float(rng.choice([0.5, 2.0, 6.0]))  # flat .. peaked
        row = rng.standard_normal(n) * scale
        if r % 5 == 0:
            row = np.round(row * 2) / 2  # many tied logits: ties go by id
        yield row.astype(np.float32)


def test_production_sampling_equals_an_independent_float64_book():
    rng = np.random.default_rng(43)
    checked = flat_answers = kept_many = 0
    for row in rows(rng, 300):
        p = SamplingParams(temperature=float(rng.choice(TEMPERATURES)), top_k=int(rng.choice(TOP_K)),
                           top_p=float(rng.choice(TOP_P)), min_p=float(rng.choice(MIN_P)))
        u = float(rng.random())
        ids, probs = book(row, p.temperature, p.top_k, p.top_p, p.min_p)
        want = draw(row, ids, p.temperature, u)
        for name, (got_ids, got_probs) in (("book", reference_distribution(row, p)), ("window", filtered_distribution(row, p))):
            assert got_ids.tolist() == ids, (name, p, len(row))
            np.testing.assert_allclose(got_probs, probs, rtol=1e-9, atol=1e-15, err_msg=f"{name} {p}")
        assert reference_sample(row, p, u) == want, p
        sampler = Sampler(p)
        sampler.rng = _Fixed(u)
        assert sampler(row) == want, (p, sampler.paths)
        if p.top_k == 0:
            tok, _flat = sample_flat(row, p.top_p, p.min_p, p.temperature, u)
            if tok is not None:
                assert tok == want, p
                flat_answers += 1
        checked += 1
        kept_many += len(ids) > 100
    assert checked == 300 and flat_answers >= 50 and kept_many >= 30  # the flat path and large kept sets were exercised


def test_greedy_is_the_first_largest_logit():
    rng = np.random.default_rng(7)
    for row in rows(rng, 50):
        x = [float(v) for v in row]
        assert Sampler(SamplingParams(temperature=0.0))(row) == min(range(len(x)), key=lambda i: (-x[i], i))
