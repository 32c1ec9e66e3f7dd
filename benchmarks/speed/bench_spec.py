#!/usr/bin/env python3
"""Plain vs speculative decoding on one pair, in one run (issue 3's bench script).

For the pair's drafter kind (and n-gram prompt lookup, which needs no model)
it runs fixed draft lengths and the adaptive length, next to plain decoding,
on a few Spec-Bench and HumanEval prompts, greedy. The modes take turns on
every prompt (the order rotates), so drift of a shared machine hits all alike.
Per mode it prints decode tok/s, the ratio to plain, τ (tokens committed per
target pass), per-position acceptance, and the time split of the decode phase
(target forward / drafter forward / host), with host overhead per cycle in ms
and as a share of the cycle; "same" counts prompts whose output equals plain
decoding token for token.

    .venv/bin/python benchmarks/speed/bench_spec.py --pair demo
    .venv/bin/python benchmarks/speed/bench_spec.py --pair qwen-coder --lengths 2,4 --tokens 64 --json out.json
    .venv/bin/python benchmarks/speed/bench_spec.py --model qwen35-mtp.gguf --kinds mtp,mtp+ngram --lengths 1,2,3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from localflash.bench import rig as bl  # noqa: E402
from localflash.bench.prompts import HUMANEVAL_COMPLETE_INSTRUCTION, humaneval, spec_bench_groups  # noqa: E402

from localflash.errors import LocalflashError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="demo", help="a models.toml pair (default: demo)")
    ap.add_argument("--model", default=None, help="a target GGUF instead of a pair (its MTP block drafts when it has one)")
    ap.add_argument("--kinds", default=None, help="drafter kinds, comma list of ngram,draft,dflash,mtp,mtp+ngram (default: the pair's kind and ngram)")
    ap.add_argument("--lengths", default="2,4,8", help="fixed draft lengths (default 2,4,8)")
    ap.add_argument("--no-adaptive", action="store_true", help="skip the adaptive-length modes")
    ap.add_argument("--per-category", type=int, default=1, help="Spec-Bench prompts per category (default 1)")
    ap.add_argument("--humaneval", type=int, default=2, help="HumanEval prompts (default 2)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("LOCALFLASH_THREADS", "1")),
                    help="llama.cpp threads (default 1: see docs/benchmarks.md on threads and shared cores)")
    ap.add_argument("--omp-wait", choices=("passive", "active", "default"), default="passive",
                    help="OpenMP wait policy for llama.cpp's threads (default passive: see localflash/bench/rig.set_omp_wait)")
    ap.add_argument("--json", default=None, help="write every run and the summary here")
    a = ap.parse_args(argv)
    bl.set_omp_wait(a.omp_wait)

    from localflash.llama import Model, ModelOptions
    from localflash.config import config_from
    from localflash.engine import drafter_kind, ensure_drafter_file

    cfg = config_from(None if a.model else a.pair, a.model, None)
    if cfg.spec == "auto":
        cfg.spec = drafter_kind(cfg)
    kinds = [k.strip() for k in a.kinds.split(",")] if a.kinds else [cfg.spec] + (["ngram"] if cfg.spec != "ngram" else [])
    kinds = [k for k in dict.fromkeys(kinds) if k and k != "none"]
    drafters = {}
    for k in kinds:
        if k in ("draft", "dflash"):
            path = ensure_drafter_file(cfg)
            if path is None:
                raise LocalflashError(f"pair {a.pair!r} has no drafter for --kinds {k}")
            drafters[k] = path
    lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    amax = {"ngram": cfg.draft_max or 8, "draft": cfg.draft_max or 8, "dflash": min(cfg.draft_max or 15, 15),
            "mtp": cfg.draft_max or 3, "mtp+ngram": cfg.draft_max or 3}
    specs = bl.mode_names(kinds, lengths, amax, adaptive=not a.no_adaptive)

    target = Model(cfg.target, ModelOptions(load_mtp=any(k.startswith("mtp") for k in kinds)))
    prompts = spec_bench_groups(a.per_category) + humaneval(a.humaneval, HUMANEVAL_COMPLETE_INSTRUCTION)
    tokenized = [bl.render(target, p.text)[1] for p in prompts]
    n_ctx = max(512, -(-(max(len(t) for t in tokenized) + a.tokens + 32) // 256) * 256)
    bench = bl.build(cfg.target, drafters, specs, n_ctx=n_ctx, threads=a.threads, target=target)
    print(f"bench_spec: {'model' if a.model else 'pair ' + a.pair} ({Path(cfg.target).name}" + "".join(f" + {k}: {Path(p).name}" for k, p in drafters.items())
          + f"), {len(prompts)} prompts x {len(bench.modes)} modes x {a.tokens} tokens, greedy, {a.threads} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    runs: dict[str, list[bl.Run]] = {m.name: [] for m in bench.modes}
    t_all = time.perf_counter()
    try:
        for m in bench.modes:  # warm-up: page weights in, calibrate the adaptive policies
            bl.run_one(bench, m, prompts[0], tokenized[0], 16)
        for i, (p, toks) in enumerate(zip(prompts, tokenized)):
            r = i % len(bench.modes)
            for m in bench.modes[r:] + bench.modes[:r]:
                runs[m.name].append(bl.run_one(bench, m, p, toks, a.tokens))
            line = " ".join(f"{m.name}={runs[m.name][-1].tok_s:.1f}" for m in bench.modes)
            print(f"  [{i + 1}/{len(prompts)}] {p.category:<14} {len(toks):4d} tok | {line}", file=sys.stderr)
    finally:
        bench.close()
    wall = time.perf_counter() - t_all

    plain = bl.summarize(runs["plain"])
    rows = {name: bl.summarize(rs, runs["plain"]) for name, rs in runs.items()}
    hdr = (f"{'mode':<16} {'tok/s':>7} {'x plain':>7} {'tau':>5} {'accept':>6}  {'target/draft/host %':>19} {'host ms/cyc':>11} "
           f"{'host CPU':>8} {'same':>5}  per-position acceptance")
    print(hdr)
    print("-" * len(hdr))
    for name, s in rows.items():
        split = f"{100 * s['target_share']:5.1f}/{100 * s['draft_share']:4.1f}/{100 * s['host_share']:4.1f}"
        print(
            f"{name:<16} {s['tok_s']:7.2f} {s['tok_s'] / plain['tok_s']:7.3f} {s['tau']:5.2f} {100 * s['acceptance']:5.1f}%  "
            f"{split:>19} {s['host_ms_per_cycle']:11.3f} {100 * s['host_cpu_share']:7.2f}% {s['same_as_plain']:>2}/{s['runs']:<2}  "
            f"{bl.fmt_pos(s['position_acceptance'])}"
        )
    print(f"(tok/s: decode phase, tokens after the first; host = decode time outside llama_decode (wall clock), "
          f"host CPU = this thread's CPU time outside llama_decode / its CPU time in the decode phase; {wall:.0f} s in all; "
          f"load average now {os.getloadavg()[0]:.2f}; peak RSS {bl.peak_rss_bytes() / 2**20:.0f} MiB)")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "pair": a.pair, "target": str(cfg.target), "drafters": {k: str(v) for k, v in drafters.items()},
            "tokens": a.tokens, "threads": a.threads, "prompts": [p.id for p in prompts], "summary": rows,
            "runs": [{k: v for k, v in vars(r).items() if k != "tokens"} for rs in runs.values() for r in rs],
            "machine": bl.machine_info(), "load": bl.load_snapshot(), "peak_rss_bytes": bl.peak_rss_bytes(),
        }, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LocalflashError as e:
        print(f"error: {e}" + (f" ({e.hint})" if e.hint else ""), file=sys.stderr)
        sys.exit(1)
