"""The windowed sampler keeps exactly the book's kept set, falls back when the window is short, and stays seed-exact.

``kept_set`` sorts only the tokens near the top logit; these tests pin it to
``reference_distribution`` (which sorts the whole vocabulary) on rows built
to hit every path, including the fallbacks, and check that speculative
sampling with top-k off still equals plain sampling with the same seed.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.draft_model import DraftModelDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import (
    Sampler,
    SamplingParams,
    kept_set,
    reference_distribution,
    reference_sample,
    sample_unfiltered,
)

QWEN36_VOCAB = 248320


def rows(vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Peaked, flat, Gaussian and tied rows: the window suffices on some, not on others."""
    rng = np.random.default_rng(seed)
    out = []
    for scale in (0.3, 2.0, 5.0):
        r = (rng.standard_normal(vocab) * scale).astype(np.float32)
        r[rng.integers(0, vocab, 4)] += rng.uniform(5, 25)
        out.append(r)
    out.append(np.zeros(vocab, np.float32))  # every token tied
    out.append(np.round(rng.standard_normal(vocab) * 3).astype(np.float32))  # many ties at every value
    return out


PARAMS = [
    SamplingParams(t, k, p, m)
    for t, k, p, m in itertools.product((0.5, 1.3), (0, 1, 40, 4999), (1.0, 0.95, 0.3), (0.0, 0.05))
]


def test_kept_set_equals_the_full_sort_on_every_path():
    seen = set()
    for row in rows(5000):
        for p in PARAMS:
            ref_ids, ref_probs = reference_distribution(row, p)
            ids, vals, how = kept_set(row, p)
            seen.add(how)
            assert np.array_equal(ids, ref_ids), (p, how)
            probs = np.exp((vals - vals[0]) / p.temperature)
            np.testing.assert_allclose(probs / probs.sum(), ref_probs, rtol=1e-12)
    assert seen >= {"window", "exact-z", "full"}  # "wider": the fallback test below


def test_fallback_triggers_when_the_window_mass_is_short():
    rng = np.random.default_rng(1)
    # a flat row: the tokens within the window hold far less than top_p of the mass
    flat = (rng.standard_normal(QWEN36_VOCAB) * 0.5).astype(np.float32)
    p = SamplingParams(1.0, 0, 0.95)
    ids, _, how = kept_set(flat, p, window=64)
    assert how != "window"
    assert np.array_equal(ids, reference_distribution(flat, p)[0])
    # a peaked row at the real vocabulary: the first window settles it
    peaked = flat * 4
    peaked[[7, 99, 12345]] += 40
    ids, _, how = kept_set(peaked, p)
    assert how == "window" and np.array_equal(ids, reference_distribution(peaked, p)[0])
    # a strided sample that overrates the row: fewer than k tokens pass its threshold, so the window grows
    tricky = flat.copy()
    tricky[::16][:60] = 100.0
    p = SamplingParams(1.0, 200, 1.0)
    ids, _, how = kept_set(tricky, p)
    assert how in ("wider", "full") and np.array_equal(ids, reference_distribution(tricky, p)[0])


def test_exact_normaliser_settles_a_cut_the_bounds_leave_open():
    # 10 tokens at the top, a long tail 8-9 nats below: what the window leaves out may or may not push the cut
    row = np.random.default_rng(3).uniform(-9, -8, 20000).astype(np.float32)
    row[:10] = 0.0
    p = SamplingParams(1.0, 0, 0.5)
    ids, _, how = kept_set(row, p)
    assert how == "exact-z"
    assert np.array_equal(ids, reference_distribution(row, p)[0])


def _boundary_row() -> np.ndarray:
    """10 tokens at the top, a long tail 8-9 nats below: the tail decides the normaliser."""
    row = np.random.default_rng(3).uniform(-9, -8, 20000).astype(np.float32)
    row[:10] = 0.0
    return row


def _book_cumsum(row: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    vals = np.sort(row.astype(np.float64))[::-1]
    return np.cumsum(np.exp((vals - vals[0]) / temperature))


def test_a_top_p_cut_within_rounding_of_a_boundary_is_the_books():
    """top_p * Z lands 1e-13 (relative) either side of the 7th token's cumulative weight.

    A normaliser off by float32 rounding (~1e-9 relative here) keeps 7 tokens on both sides; the
    book keeps 7 below the boundary and 8 above it, and so must the fast path.
    """
    row = _boundary_row()
    z = _book_cumsum(row)[-1]
    kept = {}
    for side in (-1, 1):
        p = SamplingParams(1.0, 0, 7 / z * (1 + side * 1e-13))
        ids, _, _ = kept_set(row, p)
        ref = reference_distribution(row, p)[0]
        assert np.array_equal(ids, ref), (side, len(ids), len(ref))
        kept[side] = len(ids)
    assert kept == {-1: 7, 1: 8}  # the row does sit on the boundary


def test_a_draw_within_rounding_of_a_boundary_is_the_books():
    """u * Z lands 1e-13 (relative) either side of a cumulative weight, in the window and in the tail."""
    row = _boundary_row()
    for t in (1.0, 0.7):
        cum = _book_cumsum(row, t)
        for i in (3, 9, 500):  # inside the 10 tied tokens, at their end, in the tail
            for side in (-1, 1):
                u = cum[i] / cum[-1] * (1 + side * 1e-13)
                tok, _ = sample_unfiltered(row, t, u)
                assert tok == reference_sample(row, SamplingParams(t, 0, 1.0), u), (t, i, side)
    cum = _book_cumsum(np.sort(row)[-40:], 0.7)  # the sampler over a top-k set: its own cumulative weights
    for i in (3, 9, 30):
        for side in (-1, 1):
            u = cum[i] / cum[-1] * (1 + side * 1e-13)
            s = Sampler(SamplingParams(0.7, 40, 1.0))
            s.rng = _Fixed(u)
            assert s(row) == reference_sample(row, SamplingParams(0.7, 40, 1.0), u), (i, side)


class _Fixed:
    """A generator that always draws ``u``."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def test_unfiltered_sampling_is_the_reference_inverse_cdf():
    rng = np.random.default_rng(2)
    for row in rows(3000, seed=4):
        for t in (0.4, 1.0, 2.0):
            for u in rng.random(40):
                tok, _ = sample_unfiltered(row, t, u)
                assert tok == reference_sample(row, SamplingParams(t, 0, 1.0, 0.0), u)


def test_sampler_draws_one_uniform_per_row_and_greedy_is_argmax():
    row = rows(QWEN36_VOCAB)[2]
    for p in (SamplingParams(0.8, 40, 0.95, 0.05, seed=5), SamplingParams(0.8, 0, 0.95, seed=5), SamplingParams(0.8, 0, 1.0, seed=5)):
        s = Sampler(p)
        for _ in range(3):
            s(row)
        twin = np.random.default_rng(5)
        twin.random(3)
        assert s.rng.random() == twin.random()
    assert Sampler()(row) == int(np.argmax(row))


@pytest.mark.parametrize("top_p", [0.95, 1.0])
def test_top_k_off_speculative_sampling_equals_plain_with_same_seed(tiny_target, tiny_drafters, top_p):
    target = Model(tiny_target)

    def run(draft: bool, toks, sp):
        ctx = Context(target, ContextOptions(n_ctx=512, n_outputs_max=5, n_threads=1))
        drafter = DraftModelDrafter(Model(tiny_drafters["near"]), target, 512, 4, n_threads=1) if draft else None
        eng = Engine(target, ctx, drafter, adaptive=False, draft_max=4 if draft else 0)
        out = [t for c in eng.generate(toks, 48, sp) for t in c]
        eng.close()
        return out

    for seed, text in enumerate(["the river of quiet stone", "nine silver hills where we", "a garden of paper light"]):
        toks = target.tokenize(text)
        sp = SamplingParams(temperature=1.0, top_k=0, top_p=top_p, seed=seed)
        assert run(True, toks, sp) == run(False, toks, sp)


@pytest.mark.parametrize("top_k,top_p,min_p", [(40, 0.95, 0.05), (0, 0.95, 0.0), (0, 1.0, 0.05), (40, 0.9, 0.0)])
def test_a_peaked_rows_lone_token_is_the_books_and_a_tie_at_the_top_is_never_lone(top_k, top_p, min_p):
    """The lone-token shortcut (one argmax and a compare pass) takes only rows whose filters keep the top
    token alone, returns the book's token there, and leaves every other row to the kept-set path."""
    rng = np.random.default_rng(5)
    lone = other = 0
    for trial in range(60):
        n = int(rng.choice([1000, QWEN36_VOCAB]))
        row = rng.normal(size=n).astype(np.float32) * 2
        row[int(rng.integers(n))] += float(rng.uniform(0, 25))  # from barely ahead to far ahead
        tied = trial % 5 == 0
        if tied:
            j = int(np.argmax(row))
            row[(j + 7) % n] = row[j]
        p = SamplingParams(0.8, top_k, top_p, min_p, seed=trial)
        s = Sampler(p)
        u = np.random.default_rng(trial).random()  # the Sampler's own first draw
        assert s(row) == reference_sample(row, p, u)
        assert not (tied and "lone" in s.paths)
        lone += "lone" in s.paths
        other += "lone" not in s.paths
    assert lone >= 10 and other >= 10  # both kinds of row were met, so the test can fail either way
