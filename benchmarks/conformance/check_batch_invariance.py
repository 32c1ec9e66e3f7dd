#!/usr/bin/env python3
"""Are a model's logits the same when tokens are decoded in a batch as when decoded one at a time?

Greedy speculative decoding equals plain decoding token for token only if the
target's logits for a row do not depend on how many rows the batch has. This
prefills a prompt of a chosen length (Spec-Bench first turns joined and cut to
``--ctx-tokens``), decodes a greedy continuation one token at a time, then
re-decodes it in windows of ``--batch`` tokens (a verify step of batch-1
drafted tokens) and reports the largest |Δlogit| between the two, how many
argmaxes flipped, and the smallest top-2 margin seen (a near-tie where any Δ can
flip the argmax). Every combination of thread count, CPU weight repacking
(``use_extra_bufts``) and flash attention runs in its own process.

    .venv/bin/python benchmarks/conformance/check_batch_invariance.py --threads 1,2
    .venv/bin/python benchmarks/conformance/check_batch_invariance.py --pair qwen-coder --repack on,off --fa on,off \\
        --ctx-tokens 64,600,1100 --batch 5,17 --steps 12

``--exact`` adds a row per thread count with exactly what ``localflash --exact`` sets
(engine.exact_options: repacking off, tiled matmul off, flash attention on, one-row
decodes padded to two rows); docs/benchmarks.md has the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def prompt_tokens(m, n: int) -> list[int]:
    """``n`` tokens of chat-formatted Spec-Bench prompts (joined until long enough)."""
    from localflash.bench import rig as bl
    from localflash.bench.prompts import spec_bench_groups

    text, toks = "", []
    for p in spec_bench_groups(10):
        text += p.text + "\n\n"
        toks = bl.render(m, text)[1]
        if len(toks) >= n:
            break
    return toks[:n] if len(toks) >= n else (toks * (n // max(len(toks), 1) + 1))[:n]


def measure(model_path: str, threads: int, repack: bool, fa: bool, lengths: list[int], batches: list[int], steps: int,
            exact: bool = False) -> list[dict]:
    import numpy as np

    from localflash.llama import Context, ContextOptions, Model, ModelOptions
    from localflash.engine import exact_options

    model_kw, ctx_kw = exact_options(exact, "llama") if exact else ({"use_extra_bufts": repack}, {"flash_attn": 1 if fa else 0})
    m = Model(model_path, ModelOptions(**model_kw))
    out_rows = []
    for n_prompt in lengths:
        toks = prompt_tokens(m, n_prompt)
        ctx = Context(m, ContextOptions(n_ctx=n_prompt + steps + max(batches) + 64, n_threads=threads,
                                        n_outputs_max=max(batches), **ctx_kw))
        for off in range(0, len(toks), 512):
            ch = toks[off : off + 512]
            ctx.decode(ch, off, "last" if off + len(ch) == len(toks) else "none")
        single = [ctx.logits(-1).copy()]
        out = [int(np.argmax(single[0]))]
        n = len(toks)
        for i in range(steps + max(batches)):
            ctx.decode([out[-1]], n + i, "last")
            single.append(ctx.logits(-1).copy())
            out.append(int(np.argmax(single[-1])))
        for batch in batches:
            worst, flips, margin, rows_differ = 0.0, 0, float("inf"), 0
            for s in range(steps):
                ctx.seq_rm(n + s)
                ctx.decode(out[s : s + batch], n + s, "all")
                rows = ctx.all_logits()
                for j in range(batch):
                    ref = single[s + j + 1]
                    d = float(np.abs(rows[j] - ref).max())
                    worst = max(worst, d)
                    rows_differ += int(d > 0)
                    flips += int(np.argmax(rows[j]) != np.argmax(ref))
                    top = np.sort(ref)[-2:]
                    margin = min(margin, float(top[1] - top[0]))
            out_rows.append({"threads": threads, "repack": repack, "fa": fa, "exact": exact, "prompt_tokens": n, "batch": batch,
                             "positions": steps * batch, "rows_differ": rows_differ, "max_abs_dlogit": worst,
                             "argmax_flips": flips, "min_top2_margin": margin})
        ctx.close()
    return out_rows


TILED_ENV = {"default": {}, "off": {"GGML_CPU_TILED_MM": "0"}, "force": {"GGML_CPU_TILED_MM_FORCE": "1"}}


def onoff(s: str) -> list[bool]:
    return [x.strip() == "on" for x in s.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repack", default="on,off", help="CPU weight repacking (use_extra_bufts): on,off")
    ap.add_argument("--fa", default="on", help="flash attention: on,off")
    ap.add_argument("--tiled", default="default", help="ggml's tiled K-quant matmul (batches of 8+ rows): default,off,force "
                    "(GGML_CPU_TILED_MM=0 / GGML_CPU_TILED_MM_FORCE=1)")
    ap.add_argument("--ctx-tokens", default="", help="prompt lengths in tokens (default: one Spec-Bench summarization prompt)")
    ap.add_argument("--batch", default="5", help="rows per verify batch, comma-separated")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--exact", action="store_true", help="also measure exact mode (engine.exact_options: the --exact settings) per thread count")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from localflash.config import config_from

    path = str(config_from(a.pair, None, None).target)
    batches = [int(x) for x in a.batch.split(",")]
    if a.one is not None:
        t, r, f, x = a.one.split(":")
        lengths = [int(x) for x in a.ctx_tokens.split(",")] if a.ctx_tokens else [0]
        if lengths == [0]:
            from localflash.bench import rig as bl
            from localflash.bench.prompts import spec_bench_groups
            from localflash.llama import Model, ModelOptions

            m = Model(path, ModelOptions(vocab_only=True))
            lengths = [len(bl.render(m, next(x for x in spec_bench_groups(1) if x.category == "summarization").text)[1])]
            m.close()
        print(json.dumps(measure(path, int(t), r == "1", f == "1", lengths, batches, a.steps, x == "1")))
        return 0
    rows = []
    for t in (int(x) for x in a.threads.split(",")):
        for repack in onoff(a.repack):
            combos = [(f, m, 0) for f in onoff(a.fa) for m in a.tiled.split(",")]
            if a.exact and repack == onoff(a.repack)[-1]:
                combos.append((True, "off", 1))
            for fa, tiled, exact in combos:
                env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **TILED_ENV[tiled])
                cmd = [sys.executable, __file__, "--pair", a.pair, "--batch", a.batch, "--steps", str(a.steps),
                       "--ctx-tokens", a.ctx_tokens, "--one", f"{t}:{int(repack)}:{int(fa)}:{exact}"]
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode:
                    sys.stderr.write(res.stderr[-3000:])
                    return res.returncode
                for r in json.loads(res.stdout.strip().splitlines()[-1]):
                    r["tiled"] = tiled
                    rows.append(r)
                    what = ("EXACT MODE (--exact)" if r["exact"] else
                            f"repack {'on' if r['repack'] else 'off'}, fa {'on' if r['fa'] else 'off'}, tiled {tiled}")
                    print(f"{Path(path).name}: threads {r['threads']}, {what}, {r['prompt_tokens']}-token prompt, {r['positions']} positions "
                          f"in batches of {r['batch']}: rows differing {r['rows_differ']}, max |Δlogit| {r['max_abs_dlogit']:.4g}, "
                          f"argmax flips {r['argmax_flips']}, smallest top-2 margin {r['min_top2_margin']:.4g}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
