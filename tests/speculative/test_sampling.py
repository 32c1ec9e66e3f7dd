"""Speculative sampling follows the target's distribution: a chi-square test that can fail.

For every token the verify step produced (positions after the prefill token),
the target's exact filtered distribution given the actual prefix is computed
by plain decoding. The randomized probability integral transform of the token
under that distribution is uniform on [0, 1) exactly when the token was drawn
from it; binned PIT values (and pairs of consecutive ones, for the joint)
are then checked with a chi-square test. A verify step that accepts every
draft must fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest

from localflash.llama import Context, ContextOptions, Model
from localflash.speculative import loop
from localflash.speculative.draft_model import DraftModelDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams, filtered_distribution

CHI2_99 = {9: 21.666, 15: 30.578}  # chi-square critical values at p = 0.01
RUNS, LENGTH = 240, 9


def pit_values(target: Model, sampling: SamplingParams, tiny_drafter, seed0: int):
    prompt = target.tokenize("the river of quiet stone and")
    ctx = Context(target, ContextOptions(n_ctx=256, n_outputs_max=5, n_threads=1))
    engine = Engine(target, ctx, DraftModelDrafter(Model(tiny_drafter), target, 256, 4, n_threads=1), adaptive=False)
    exact = Context(target, ContextOptions(n_ctx=256, n_outputs_max=64, n_threads=1))
    rng = np.random.default_rng(seed0)
    singles, pairs, impossible = [], [], 0
    for run in range(RUNS):
        params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, seed=seed0 + run)
        out = [t for c in engine.generate(prompt, LENGTH, params) for t in c]
        exact.clear()
        exact.decode(prompt + out[:-1], 0, "all")
        rows = exact.all_logits()
        us = []
        for t in range(1, len(out)):  # t = 0 came from the prefill row, not from a verify step
            ids, probs = filtered_distribution(rows[len(prompt) - 1 + t], params)
            where = np.flatnonzero(ids == out[t])
            if len(where) == 0:  # outside the target's top-k/top-p set: impossible under exact sampling
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


def distribution_stats(target, sampling, drafter, seed0):
    singles, pairs, impossible = pit_values(target, sampling, drafter, seed0)
    single = np.histogram(singles, bins=10, range=(0, 1))[0]
    joint = np.histogram2d(pairs[:, 0], pairs[:, 1], bins=4, range=((0, 1), (0, 1)))[0]
    return chi2(single), chi2(joint), len(singles), impossible


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target)


@pytest.mark.parametrize("temp,top_p", [(0.7, 0.9), (1.0, 0.95)])
def test_speculative_sampling_matches_target_distribution(target, tiny_drafters, temp, top_p):
    sampling = SamplingParams(temperature=temp, top_k=0, top_p=top_p)
    single, joint, n, impossible = distribution_stats(target, sampling, tiny_drafters["near"], seed0=1000)
    assert impossible == 0 and n == RUNS * (LENGTH - 1)
    assert single < CHI2_99[9], f"PIT histogram chi2 {single:.1f}"
    assert joint < CHI2_99[15], f"consecutive-pair chi2 {joint:.1f}"


def test_accepting_every_draft_fails_the_distribution_test(target, tiny_drafters, monkeypatch):
    def trusting(ctx, draft, sample, is_eog):
        return list(draft) + [sample(ctx.logits(len(draft) if draft else -1))]

    monkeypatch.setattr(loop, "verify_block", trusting)
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=0.95)
    single, joint, _, impossible = distribution_stats(target, sampling, tiny_drafters["near"], seed0=1000)
    assert impossible > 0 or single > CHI2_99[9] or joint > CHI2_99[15]
