#!/usr/bin/env python3
"""How small a sampling error the chi-square test (tests/speculative/test_sampling.py) can see.

Records the rows that test samples (its tiny target and drafter, prompt, settings and seeds,
through the speculative engine), then, for each row, draws tokens from a deviated sampler
instead of the book's distribution and applies the test's own checks (its ``book``,
histograms, chi-square and critical values, imported from the test file) to as many tokens
as the test sees. Each deviation is repeated ``--reps`` times with fresh draws; the table
gives how often the test fails and the mean per-token total-variation distance between the
deviated and the book's distribution. Deviations:

- ``temperature ×(1+δ)``: the right kept set, the wrong temperature;
- ``ε to the top token``: ε of each row's probability moved from the others to its top token;
- ``last kept token dropped``: a cut one token early (the deviation is that token's probability).

δ = 0 is the false-alarm rate. No timing; a few minutes on one core.

    .venv/bin/python benchmarks/conformance/chi2_power.py --reps 400
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np

TEST_FILE = Path(__file__).resolve().parents[2] / "tests" / "speculative" / "test_sampling.py"


def load_test_module():
    spec = importlib.util.spec_from_file_location("chi2_test", TEST_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def recorded_rows(t, setting, target_path: Path, drafter_path: Path, seed0: int = 1000):
    """Per run, the book's (probabilities, kept logits) at each verified position of the test's own runs."""
    from localflash.llama import Context, ContextOptions, Model
    from localflash.speculative.draft_model import DraftModelDrafter
    from localflash.speculative.loop import Engine
    from localflash.speculative.sampling import SamplingParams

    target = Model(target_path)
    prompt = target.tokenize(t.PROMPT)
    ctx = Context(target, ContextOptions(n_ctx=256, n_outputs_max=5, n_threads=1))
    engine = Engine(target, ctx, DraftModelDrafter(Model(drafter_path), target, 256, 4, n_threads=1), adaptive=False)
    exact = Context(target, ContextOptions(n_ctx=256, n_outputs_max=64, n_threads=1))
    runs = []
    s = setting
    for run in range(t.RUNS):
        params = SamplingParams(s.temperature, s.top_k, s.top_p, s.min_p, seed=seed0 + run)
        out = [x for c in engine.generate(prompt, t.LENGTH, params) for x in c]
        exact.clear()
        exact.decode(prompt + out[:-1], 0, "all")
        rows = exact.all_logits()
        per = []
        for i in range(1, len(out)):
            row = rows[len(prompt) - 1 + i]
            ids, probs = t.book(row, params)
            per.append((probs, np.sort(row.astype(np.float64))[::-1][: len(ids)]))
        runs.append(per)
    engine.close()
    return runs


def deviated(probs: np.ndarray, vals: np.ndarray, temperature: float, family: str, size: float) -> np.ndarray:
    if family == "temperature":
        return _softmax(vals / (temperature * (1 + size)))
    if family == "to-top":
        q = probs * (1 - size)
        q[0] += size
        return q
    if family == "drop-last":
        if len(probs) == 1:
            return probs
        return probs[:-1] / probs[:-1].sum()
    raise ValueError(family)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def detection(t, runs, temperature: float, family: str, size: float, reps: int, rng) -> tuple[float, float]:
    """(share of repetitions the test fails, mean per-token TV distance)."""
    dists = [[(p, deviated(p, v, temperature, family, size)) for p, v in per] for per in runs]
    tv = float(np.mean([0.5 * np.abs(np.pad(q, (0, len(p) - len(q))) - p).sum() for per in dists for p, q in per]))
    fails = 0
    for _ in range(reps):
        singles, pairs = [], []
        for per in dists:
            us = []
            for p, q in per:
                i = min(int(np.searchsorted(np.cumsum(q), rng.random(), side="right")), len(q) - 1)
                us.append(p[:i].sum() + rng.random() * p[i])
            singles += us
            pairs += list(zip(us[:-1], us[1:]))
        singles, pairs = np.array(singles), np.array(pairs)
        single = t.chi2(np.histogram(singles, bins=10, range=(0, 1))[0])
        joint = t.chi2(np.histogram2d(pairs[:, 0], pairs[:, 1], bins=4, range=((0, 1), (0, 1)))[0])
        fails += single >= t.CHI2_99[9] or joint >= t.CHI2_99[15]
    return fails / reps, tv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--deltas", default="0,0.02,0.05,0.08,0.1,0.15,0.2")
    ap.add_argument("--epsilons", default="0.01,0.02,0.03,0.05,0.08")
    a = ap.parse_args(argv)
    from localflash.testing.tiny import TinySpec, write_target

    t = load_test_module()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        target = write_target(Path(d) / "target.gguf", TinySpec(n_layer=4, seed=0))  # conftest's tiny_target
        drafter = write_target(Path(d) / "near.gguf", TinySpec(n_layer=4, seed=0, noise=0.1))  # tiny_drafters["near"]
        print(f"tokens per check: {t.RUNS * (t.LENGTH - 1)}; {a.reps} repetitions per row of the table\n")
        print("| setting | deviation | size | mean per-token TV distance | test fails |")
        print("|---|---|---|---|---|")
        for name, setting in (("top-p binds", t.TOP_P_BINDS), ("min-p binds", t.MIN_P_BINDS)):
            runs = recorded_rows(t, setting, target, drafter)
            cases = [("temperature", float(x)) for x in a.deltas.split(",")]
            cases += [("to-top", float(x)) for x in a.epsilons.split(",")] + [("drop-last", 1.0)]
            for family, size in cases:
                rate, tv = detection(t, runs, setting.temperature, family, size, a.reps, rng)
                label = {"temperature": f"temperature ×(1+{size:g})", "to-top": f"{size:g} to the top token",
                         "drop-last": "last kept token dropped"}[family]
                shown = "—" if family == "drop-last" else f"{size:g}"
                print(f"| {name} | {label} | {shown} | {tv:.4f} | {100 * rate:.0f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
