"""Speculative sampling follows the target's distribution: a chi-square test against a reference of its own.

For every token the verify step produced (positions after the prefill token),
the target's row given the actual prefix is decoded again (plain, one batch),
and :func:`book` — written here, independent of ``localflash.speculative.sampling``:
a full float64 sort, then llama.cpp's chain top-k → top-p → min-p → temperature —
gives the distribution the token should have come from. The randomized
probability integral transform of the token under it is uniform on [0, 1)
exactly when the token was drawn from it; binned PIT values (and pairs of
consecutive ones, for the joint) are checked with a chi-square test, and a
token outside the book's kept set fails at once.

The test can fail: a verify step that accepts every draft, and three sampler
bugs planted in the real filter code (``sampling._keep``), each must be caught —
a top-p cut one token early, the temperature applied before top-p/min-p, and
min-p measured against the total mass instead of the top token's. Its power,
measured by ``benchmarks/conformance/chi2_power.py`` on the rows this test samples,
is in docs/benchmarks.md ("Sampling").
"""

from __future__ import annotations

import numpy as np
import pytest

from localflash.llama import Context, ContextOptions, Model
from localflash.speculative import loop, sampling
from localflash.speculative.draft_model import DraftModelDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams

CHI2_99 = {9: 21.666, 15: 30.578}  # chi-square critical values at p = 0.01
RUNS, LENGTH = 240, 9
PROMPT = "the river of quiet stone and"
# two settings, so that each filter decides somewhere: top-p binds (top-k 40 first, so its mass is the
# top 40's), and min-p binds (top-p 0.95 keeps hundreds of this model's tokens, min-p 0.05 a few dozen)
TOP_P_BINDS = SamplingParams(temperature=0.7, top_k=40, top_p=0.5)
MIN_P_BINDS = SamplingParams(temperature=1.5, top_k=0, top_p=0.95, min_p=0.05)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def book(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's sampler chain by hand: kept ids (descending logit, ties by id) and their probabilities.

    top-k keeps the k highest; top-p the shortest prefix whose probability (softmax of what
    top-k left, untempered) reaches top_p; min-p the tokens whose probability is at least
    min_p times the top token's; then the temperature scales what is left, and the draw is
    from its softmax (llama.cpp: llama_sampler_top_k / top_p / min_p / temp / dist).
    """
    x = logits.astype(np.float64)
    ids = np.lexsort((np.arange(len(x)), -x))
    x = x[ids]
    if 0 < p.top_k < len(x):
        ids, x = ids[: p.top_k], x[: p.top_k]
    if p.top_p < 1.0:
        cum = np.cumsum(_softmax(x))
        n = int(np.argmax(cum >= p.top_p)) + 1 if cum[-1] >= p.top_p else len(x)
        ids, x = ids[:n], x[:n]
    if p.min_p > 0.0:
        probs = _softmax(x)
        keep = probs >= p.min_p * probs.max()
        ids, x = ids[keep], x[keep]
    return ids, _softmax(x / p.temperature)


def pit_values(target: Model, sampling_params: SamplingParams, tiny_drafter, seed0: int, in_graph: bool = False):
    """PIT values of every verified token under the book, consecutive pairs, and tokens outside its kept set.

    ``in_graph``: the target's rows sampled by llama.cpp's chain in the graph (speculative/graph_sampler.py).
    """
    prompt = target.tokenize(PROMPT)
    ctx = Context(target, ContextOptions(n_ctx=256, n_outputs_max=5, n_threads=1))
    engine = Engine(target, ctx, DraftModelDrafter(Model(tiny_drafter), target, 256, 4, n_threads=1), adaptive=False,
                    sample_in_graph=in_graph)
    exact = Context(target, ContextOptions(n_ctx=256, n_outputs_max=64, n_threads=1))
    rng = np.random.default_rng(seed0)
    singles, pairs, impossible = [], [], 0
    s = sampling_params
    for run in range(RUNS):
        params = SamplingParams(s.temperature, s.top_k, s.top_p, s.min_p, seed=seed0 + run)
        out = [t for c in engine.generate(prompt, LENGTH, params) for t in c]
        exact.clear()
        exact.decode(prompt + out[:-1], 0, "all")
        rows = exact.all_logits()
        us = []
        for t in range(1, len(out)):  # t = 0 came from the prefill row, not from a verify step
            ids, probs = book(rows[len(prompt) - 1 + t], params)
            where = np.flatnonzero(ids == out[t])
            if len(where) == 0:  # outside the book's kept set: impossible under exact sampling
                impossible += 1
                continue
            i = int(where[0])
            us.append(probs[:i].sum() + rng.random() * probs[i])
        singles += us
        pairs += list(zip(us[:-1], us[1:]))
    engine.close()
    return np.array(singles), np.array(pairs), impossible


def chi2(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def failures(target, sampling_params, drafter, seed0=1000, in_graph=False) -> list[str]:
    """What the test objects to (empty: the tokens follow the book's distribution)."""
    singles, pairs, impossible = pit_values(target, sampling_params, drafter, seed0, in_graph)
    single = chi2(np.histogram(singles, bins=10, range=(0, 1))[0])
    joint = chi2(np.histogram2d(pairs[:, 0], pairs[:, 1], bins=4, range=((0, 1), (0, 1)))[0])
    out = []
    if impossible:
        out.append(f"{impossible} tokens outside the book's kept set")
    if len(singles) + impossible != RUNS * (LENGTH - 1):
        out.append(f"{len(singles) + impossible} verified tokens, not {RUNS * (LENGTH - 1)}")
    if single >= CHI2_99[9]:
        out.append(f"PIT histogram chi2 {single:.1f}")
    if joint >= CHI2_99[15]:
        out.append(f"consecutive-pair chi2 {joint:.1f}")
    return out


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target)


def test_book_is_llama_cpp_order_on_a_small_row():
    """The reference itself, by hand: logits 3, 2, 1, 0, -5 (ids 0..4), probabilities 0.644, 0.237, 0.087, 0.032, 0.0002."""
    row = np.array([3.0, 2.0, 1.0, 0.0, -5.0], np.float32)
    assert list(book(row, SamplingParams(1.0, 0, 0.85))[0]) == [0, 1]  # 0.644 < 0.85 <= 0.881
    assert list(book(row, SamplingParams(1.0, 0, 0.89))[0]) == [0, 1, 2]
    assert list(book(row, SamplingParams(1.0, 0, 0.70))[0]) == [0, 1]
    assert list(book(row, SamplingParams(1.0, 2, 0.70))[0]) == [0]  # top-p after top-k: 0.731 of the top 2's mass
    assert list(book(row, SamplingParams(1.0, 0, 1.0, 0.1))[0]) == [0, 1, 2]  # 0.087 >= 0.1 * 0.644 > 0.032
    assert list(book(row, SamplingParams(1.0, 0, 0.85, 0.5))[0]) == [0]  # min-p after top-p: 0.237 < 0.5 * 0.644
    ids, probs = book(row, SamplingParams(0.5, 0, 0.89))  # the temperature after the filters: same set, sharper
    assert list(ids) == [0, 1, 2]
    np.testing.assert_allclose(probs, np.exp(2 * row[:3]) / np.exp(2 * row[:3]).sum())


@pytest.mark.parametrize("setting", [TOP_P_BINDS, MIN_P_BINDS], ids=["top-p-binds", "min-p-binds"])
def test_speculative_sampling_matches_the_books_distribution(target, tiny_drafters, setting):
    assert failures(target, setting, tiny_drafters["near"]) == []


@pytest.mark.parametrize("setting", [TOP_P_BINDS, MIN_P_BINDS], ids=["top-p-binds", "min-p-binds"])
def test_speculative_sampling_in_the_graph_matches_the_books_distribution(target, tiny_drafters, setting):
    """The same test with the target's rows sampled by llama.cpp's chain (top-k, top-p, min-p, temp, dist) in the graph."""
    assert failures(target, setting, tiny_drafters["near"], in_graph=True) == []


def test_accepting_every_draft_fails_the_distribution_test(target, tiny_drafters, monkeypatch):
    def trusting(ctx, draft, sample, is_eog):
        return list(draft) + [sample(ctx.logits(len(draft) if draft else -1))]

    monkeypatch.setattr(loop, "verify_block", trusting)
    assert failures(target, MIN_P_BINDS, tiny_drafters["near"])


def _top_p_one_early(vals, p):
    keep, w = len(vals), np.exp(vals - vals[0])
    if p.top_p < 1.0:
        cum = np.cumsum(w)
        keep = min(keep, int(np.searchsorted(cum, p.top_p * cum[-1])))  # the planted bug: no + 1
    if p.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(w >= p.min_p)))
    return max(keep, 1)


def _temperature_first(vals, p):
    keep, w = len(vals), np.exp((vals - vals[0]) / p.temperature)  # the planted bug: tempered before the filters
    if p.top_p < 1.0:
        cum = np.cumsum(w)
        keep = min(keep, int(np.searchsorted(cum, p.top_p * cum[-1])) + 1)
    if p.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(w >= p.min_p)))
    return max(keep, 1)


def _min_p_of_the_total(vals, p):
    keep, w = len(vals), np.exp(vals - vals[0])
    if p.top_p < 1.0:
        cum = np.cumsum(w)
        keep = min(keep, int(np.searchsorted(cum, p.top_p * cum[-1])) + 1)
    if p.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(w / w.sum() >= p.min_p)))  # the planted bug: min_p of the total mass
    return max(keep, 1)


@pytest.mark.parametrize("bug, setting", [
    (_top_p_one_early, TOP_P_BINDS),
    (_temperature_first, TOP_P_BINDS),
    (_temperature_first, MIN_P_BINDS),
    (_min_p_of_the_total, MIN_P_BINDS),
], ids=["top-p-one-early", "temperature-first/top-p", "temperature-first/min-p", "min-p-of-the-total"])
def test_a_planted_sampler_bug_fails_the_distribution_test(target, tiny_drafters, monkeypatch, bug, setting):
    monkeypatch.setattr(sampling, "_keep", bug)
    assert failures(target, setting, tiny_drafters["near"])
