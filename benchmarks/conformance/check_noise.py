#!/usr/bin/env python3
"""Paired A/B of plain decoding against one speculative engine: the noise floor of bench ratios, or what an adaptive mode costs.

Plain decoding and the pair's engine take turns on every prompt (A B B A, so a drift in the machine's speed
falls on both), greedy, one thread; it prints each run's decode tok/s and, per mode, the median over prompts of
B's tok/s / A's (each prompt's two runs of a side averaged first):

    .venv/bin/python benchmarks/conformance/check_noise.py qwen-coder                  # B = the engine never drafting
    .venv/bin/python benchmarks/conformance/check_noise.py demo-draft --vs adaptive --vs ngram-adaptive --prompts 12

``--vs no-draft`` (the default) is the same target work on both sides, so its ratio is the machine's noise;
``adaptive`` is the pair's own drafter with the cost-model length, ``ngram-adaptive`` n-gram lookup with it.
Not a test: a benchmark, run on an idle machine and quote the load it prints.
"""

from __future__ import annotations

import argparse
import os
import statistics

from localflash.bench import rig as bl
from localflash.bench.prompts import spec_bench_groups

MODES = ("no-draft", "adaptive", "ngram-adaptive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pair", nargs="?", default="demo", help="a models.toml pair (default demo)")
    ap.add_argument("--vs", action="append", choices=MODES, help="engine(s) set against plain (default no-draft)")
    ap.add_argument("--prompts", type=int, default=2, help="Spec-Bench prompts, taken over its six groups (default 2)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens a run (default 64)")
    a = ap.parse_args()

    from localflash.config import config_from
    from localflash.engine import open_engine
    from localflash.errors import LocalflashError
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats

    try:
        plain = open_engine(config_from(a.pair, None, None, threads=1, spec="none"))
        engines = {}
        for mode in a.vs or ["no-draft"]:
            eng = open_engine(config_from(a.pair, None, None, threads=1, spec="ngram" if mode == "ngram-adaptive" else None))
            if mode == "no-draft":
                eng.policy.choose = lambda limit: 0  # same engine, never drafts
            engines[mode] = eng
    except LocalflashError as e:
        raise SystemExit(f"error: {e}")

    def tps(eng, toks) -> float:
        eng.reset()
        st = Stats()
        for _ in eng.generate(toks, a.tokens, SamplingParams(temperature=0.0), st):
            pass
        return st.decode_tps

    groups = max(1, -(-a.prompts // 6))
    prompts = spec_bench_groups(groups, spread_mt_bench=True)[: a.prompts]
    ratios: dict[str, list[float]] = {m: [] for m in engines}
    print(f"pair {a.pair}, {len(prompts)} prompts x {a.tokens} tokens, load average {os.getloadavg()[0]:.2f}", flush=True)
    for p in prompts:
        toks = bl.render(plain.target, p.text)[1]
        for mode, eng in engines.items():
            runs = [tps(plain, toks), tps(eng, toks), tps(eng, toks), tps(plain, toks)]
            ratios[mode].append((runs[1] + runs[2]) / (runs[0] + runs[3]))
            print(f"{p.category:15s} plain {runs[0]:6.2f} {runs[3]:6.2f} | {mode:14s} {runs[1]:6.2f} {runs[2]:6.2f} tok/s "
                  f"| {ratios[mode][-1]:.3f}x", flush=True)
    for mode, rs in ratios.items():
        print(f"{mode}: median {statistics.median(rs):.3f}x plain over {len(rs)} prompts "
              f"(min {min(rs):.3f}, max {max(rs):.3f}), load average {os.getloadavg()[0]:.2f}")
    for eng in (plain, *engines.values()):
        eng.close()


if __name__ == "__main__":
    main()
