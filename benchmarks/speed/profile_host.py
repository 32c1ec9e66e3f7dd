#!/usr/bin/env python3
"""Profile the host (Python) side of the decode loop with cProfile.

Runs one pair's modes (see bench_spec.py) on a few prompts under cProfile and
prints, per mode, where the decode phase's time went: llama_decode itself
(the forward passes) and the top Python functions by own time, so host
overhead per cycle can be traced to lines of code.

    .venv/bin/python benchmarks/speed/profile_host.py --pair demo --modes plain,ngram-k4
    .venv/bin/python benchmarks/speed/profile_host.py --pair qwen-coder --modes plain,draft-k4 --tokens 64
    .venv/bin/python benchmarks/speed/profile_host.py --micro     # the host-side pieces alone
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

from localflash.bench import rig as bl  # noqa: E402
from localflash.bench.prompts import spec_bench_groups  # noqa: E402


def micro() -> None:
    """Host-side pieces of a cycle, timed alone (no model): what each costs per call."""
    import timeit

    import numpy as np

    from localflash.speculative.adapt import DraftPolicy
    from localflash.speculative.draft_model import _common_prefix
    from localflash.speculative.drafter import NgramDrafter
    from localflash.speculative.stats import Stats

    def per_call(fn, number=200) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    rng = np.random.default_rng(0)
    for n0 in (500, 2000):
        base = rng.integers(0, 2000, size=n0).tolist()
        hist = base + [5]
        d = NgramDrafter(8)
        d.on_prompt(base)

        def grow(d=d, hist=hist):
            d.propose(hist, len(hist) - 1, 4)
            hist += [int(x) for x in rng.integers(0, 2000, size=2)]

        def scan(hist=hist):  # the window scan the index replaced (tests/speculative/test_ngram_index.py keeps it as the reference)
            h = np.asarray(hist[-4096:], dtype=np.int64)
            for size in (4, 3, 2):
                w = np.lib.stride_tricks.sliding_window_view(h[:-1], size)
                if len(np.flatnonzero((w == h[-size:]).all(axis=1))):
                    break

        print(f"n-gram proposal, {n0}-token history: window scan {per_call(scan):7.1f} us, index {per_call(grow):6.1f} us")
    a = list(range(1000)) + [1, 2, 3]
    b = list(range(1000)) + [1, 5, 6]
    def numpy_prefix(a, b):  # what the draft-model drafter did before: two whole-list conversions per cycle
        n = min(len(a), len(b))
        diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
        return int(diff[0]) if len(diff) else n

    print(f"draft-model common prefix of 1000-token lists: NumPy {per_call(lambda: numpy_prefix(a, b), 2000):6.1f} us, "
          f"list compare + tail scan {per_call(lambda: _common_prefix(a, b), 2000):6.1f} us")
    logits = rng.standard_normal((16, 151936)).astype(np.float32)
    print(f"argmax of 15 rows x 151936 (a DFlash block, Qwen vocab): {per_call(lambda: logits[1:].argmax(axis=1), 50):7.1f} us")
    print(f"argmax of 1 row x 151936 (a greedy sample): {per_call(lambda: int(np.argmax(logits[3])), 2000):6.1f} us")
    for kmax in (8, 15):
        p = DraftPolicy(kmax, True, kmax == 8)
        for k in range(1, kmax + 2):
            p.verify.add(k, 0.01 * k)
            p.draft.add(k, 0.004 * k)
        print(f"DraftPolicy({kmax}).choose: {per_call(lambda p=p: p.choose(100), 2000):6.1f} us")
    st = Stats()
    print(f"Stats.record_cycle: {per_call(lambda: st.record_cycle(4, 2, 3), 2000):6.2f} us")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro", action="store_true", help="time the host-side pieces alone (no model) and exit")
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--modes", default="plain,ngram-k4", help="comma list: plain, KIND-kN, KIND-adaptive")
    ap.add_argument("--prompts", type=int, default=3, help="Spec-Bench prompts (one per category, in order)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--out", default=None, help="write the pstats dump of each mode to OUT.MODE.prof")
    a = ap.parse_args(argv)
    if a.micro:
        micro()
        return 0
    bl.set_omp_wait("passive")

    from localflash.llama import Model
    from localflash.config import config_from
    from localflash.engine import ensure_drafter_file

    cfg = config_from(a.pair, None, None)
    specs = []
    for name in a.modes.split(","):
        if name == "plain":
            specs.append(("plain", "none", 0, False))
        else:
            kind, _, rest = name.partition("-")
            specs.append((name, kind, cfg.draft_max if rest == "adaptive" else int(rest[1:]), rest == "adaptive"))
    drafters = {k: ensure_drafter_file(cfg) for _, k, _, _ in specs if k in ("draft", "dflash")}
    target = Model(cfg.target)
    prompts = spec_bench_groups(1)[: a.prompts]
    toks = [bl.render(target, p.text)[1] for p in prompts]
    bench = bl.build(cfg.target, drafters, specs, n_ctx=4096, threads=a.threads, target=target)
    try:
        for m in bench.modes:
            bl.run_one(bench, m, prompts[0], toks[0], 16)  # warm-up and calibration
            prof = cProfile.Profile()
            runs = []
            for p, t in zip(prompts, toks):
                prof.enable()
                runs.append(bl.run_one(bench, m, p, t, a.tokens))
                prof.disable()
            s = bl.summarize(runs)
            print(f"== {m.name}: {s['tok_s']:.2f} tok/s, {s['cycles']} cycles, cycle {s['cycle_ms']:.2f} ms, "
                  f"host {s['host_ms_per_cycle']:.3f} ms/cycle ({100 * s['host_share']:.2f}%) wall, "
                  f"{s['host_cpu_ms_per_cycle']:.3f} ms/cycle ({100 * s['host_cpu_share']:.2f}%) CPU, tau {s['tau']:.2f}")
            buf = io.StringIO()
            st = pstats.Stats(prof, stream=buf)
            st.sort_stats("tottime").print_stats(a.top)
            lines = buf.getvalue().splitlines()
            start = next(i for i, ln in enumerate(lines) if "ncalls" in ln)
            print("\n".join(lines[start : start + a.top + 1]))
            if a.out:
                st.dump_stats(f"{a.out}.{m.name}.prof")
    finally:
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
