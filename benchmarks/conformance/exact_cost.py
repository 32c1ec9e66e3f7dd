#!/usr/bin/env python3
"""What exact mode costs: target verify time for 1 / 2 / 4 / 16 tokens, per numerics setting and thread count.

Settings (each in its own process, since ggml reads its switches once per process):

- ``default``: llama.cpp's defaults (CPU weight repacking on, tiled K-quant matmul for 8+ rows);
- ``norepack``: repacking off only;
- ``exact``: what ``--exact`` sets: repacking off, tiled matmul off (GGML_CPU_TILED_MM=0),
  flash attention on, one-row decodes padded to two rows;
- ``exact-nopad``: the same without the padding: what ``--exact`` does for a K-quant file at one
  thread (engine.exact_row_padding);
- ``exact-1t``: the same, but one-row decodes unpadded on one thread (what exact mode does for
  recurrent targets);
- ``exact-force``: like ``exact-1t`` with the tiled matmul forced for every batch size
  (GGML_CPU_TILED_MM_FORCE=1), the other way to make it batch-invariant.

Each verify is timed in CPU time of the process (all its threads: on a machine shared with
other processes wall time measures the neighbours; CPU time measures the work, which for 2
threads is the sum over both) after a prefill of ``--ctx-tokens`` tokens: decode n tokens at the end
of the prompt, read the logits, cut the cache back; the median of ``--reps`` timings, the
settings interleaved round by round (``--rounds``) so the drift of a shared machine is spread
over all of them. Prints a markdown table (ms, and the ratio to ``default``).

    .venv/bin/python benchmarks/conformance/exact_cost.py --pair qwen-coder --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {  # env, repack, flash_attn, ContextOptions extras
    "default": ({}, True, -1, {}),
    "norepack": ({}, False, -1, {}),
    "exact": ({"GGML_CPU_TILED_MM": "0"}, False, 1, {"min_rows": 2}),
    "exact-nopad": ({"GGML_CPU_TILED_MM": "0"}, False, 1, {}),
    "exact-1t": ({"GGML_CPU_TILED_MM": "0"}, False, 1, {"n_threads_single": 1}),
    "exact-force": ({"GGML_CPU_TILED_MM_FORCE": "1"}, False, 1, {"n_threads_single": 1}),
}


def measure(path: str, setting: str, threads: int, sizes: list[int], n_ctx_tokens: int, reps: int) -> dict:

    from check_batch_invariance import prompt_tokens
    from localflash.llama import Context, ContextOptions, Model, ModelOptions

    _, repack, fa, extra = SETTINGS[setting]
    m = Model(path, ModelOptions(use_extra_bufts=repack))
    toks = prompt_tokens(m, n_ctx_tokens)
    ctx = Context(m, ContextOptions(n_ctx=n_ctx_tokens + max(sizes) + 32, n_threads=threads, n_outputs_max=max(sizes),
                                    flash_attn=fa, **extra))
    for off in range(0, len(toks), 512):
        ctx.decode(toks[off : off + 512], off, "none")
    n = len(toks)
    out = {}
    for size in sizes:
        ts = []
        for _ in range(reps + 1):
            t = time.process_time()  # CPU seconds of all this process's threads: robust to other processes' load
            ctx.decode(toks[:size], n, "all" if size > 1 else "last")
            ctx.logits(0)
            ts.append(time.process_time() - t)
            ctx.seq_rm(n)
        out[size] = 1000 * statistics.median(ts[1:])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="qwen-coder")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--settings", default="default,norepack,exact,exact-nopad")
    ap.add_argument("--sizes", default="1,2,4,16")
    ap.add_argument("--ctx-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from localflash.config import config_from

    path = str(config_from(a.pair, None, None).target)
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.one:
        setting, t = a.one.split(":")
        print(json.dumps(measure(path, setting, int(t), sizes, a.ctx_tokens, a.reps)))
        return 0
    settings = a.settings.split(",")
    threads = [int(x) for x in a.threads.split(",")]
    got: dict[tuple[str, int], list[dict]] = {}
    for r in range(a.rounds):
        for t in threads:
            for s in settings:
                env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **SETTINGS[s][0])
                cmd = [sys.executable, __file__, "--pair", a.pair, "--sizes", a.sizes, "--ctx-tokens", str(a.ctx_tokens),
                       "--reps", str(a.reps), "--one", f"{s}:{t}"]
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode:
                    sys.stderr.write(res.stderr[-3000:])
                    return res.returncode
                got.setdefault((s, t), []).append({int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()})
                print(f"round {r + 1}: {s} t{t}: " + ", ".join(f"{k}: {v:.1f} ms" for k, v in got[(s, t)][-1].items()), file=sys.stderr, flush=True)
    best = {k: {n: min(x[n] for x in v) for n in sizes} for k, v in got.items()}
    print(f"{Path(path).name}, {a.ctx_tokens}-token context; verify CPU ms (best of {a.rounds} rounds, each the median of {a.reps}), "
          "ratio to default\n")
    print("| threads | setting | " + " | ".join(f"{n} tok" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for t in threads:
        for s in settings:
            cells = [f"{best[(s, t)][n]:.1f} ({best[(s, t)][n] / best[('default', t)][n]:.2f}×)" if ("default", t) in best else
                     f"{best[(s, t)][n]:.1f}" for n in sizes]
            print(f"| {t} | {s} | " + " | ".join(cells) + " |")
    if a.json:
        a.json.write_text(json.dumps({f"{s}:t{t}": v for (s, t), v in best.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
