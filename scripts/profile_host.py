#!/usr/bin/env python3
"""Profile the host (Python) side of the decode loop with cProfile.

Runs one pair's modes (see bench_spec.py) on a few prompts under cProfile and
prints, per mode, where the decode phase's time went: llama_decode itself
(the forward passes) and the top Python functions by own time, so host
overhead per cycle can be traced to lines of code.

    .venv/bin/python scripts/profile_host.py --pair demo --modes plain,ngram-k4
    .venv/bin/python scripts/profile_host.py --pair qwen-coder --modes plain,draft-k4 --tokens 64
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib as bl  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--modes", default="plain,ngram-k4", help="comma list: plain, KIND-kN, KIND-adaptive")
    ap.add_argument("--prompts", type=int, default=3, help="Spec-Bench prompts (one per category, in order)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--out", default=None, help="write the pstats dump of each mode to OUT.MODE.prof")
    a = ap.parse_args(argv)
    bl.set_omp_wait("passive")

    from localflash.llama import Model
    from localflash.runner import config_from, ensure_drafter_file

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
    prompts = bl.spec_bench(1)[: a.prompts]
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
