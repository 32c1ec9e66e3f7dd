#!/usr/bin/env python3
"""Are a model's logits the same when tokens are decoded in a batch as when decoded one at a time?

Greedy speculative decoding equals plain decoding token for token only if the
target's logits for a row do not depend on how many rows the batch has. This
prefills a long Spec-Bench prompt (summarization), decodes a greedy
continuation one token at a time, then re-decodes it in windows of ``--batch``
tokens and reports the largest |Δlogit| between the two, and the smallest
top-2 margin seen (a near-tie where any Δ can flip the argmax), for each
thread count (each in its own process).

    .venv/bin/python scripts/check_batch_invariance.py --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(model_path: str, threads: int, batch: int, steps: int) -> dict:
    import numpy as np

    import benchlib as bl

    from localflash.llama import Context, ContextOptions, Model

    m = Model(model_path)
    p = next(x for x in bl.spec_bench(1) if x.category == "summarization")
    toks = bl.render(m, p.text)[1]
    ctx = Context(m, ContextOptions(n_ctx=4096, n_threads=threads, n_outputs_max=batch))
    for off in range(0, len(toks), 512):
        ch = toks[off : off + 512]
        ctx.decode(ch, off, "last" if off + len(ch) == len(toks) else "none")
    single = [ctx.logits(-1).copy()]
    out = [int(np.argmax(single[0]))]
    n = len(toks)
    for i in range(steps + batch):
        ctx.decode([out[-1]], n + i, "last")
        single.append(ctx.logits(-1).copy())
        out.append(int(np.argmax(single[-1])))
    worst, flips, margin = 0.0, 0, float("inf")
    for s in range(steps):
        ctx.seq_rm(n + s)
        ctx.decode(out[s : s + batch], n + s, "all")
        rows = ctx.all_logits()
        for j in range(batch):
            ref = single[s + j + 1]
            worst = max(worst, float(np.abs(rows[j] - ref).max()))
            flips += int(np.argmax(rows[j]) != np.argmax(ref))
            top = np.sort(ref)[-2:]
            margin = min(margin, float(top[1] - top[0]))
    return {"threads": threads, "prompt_tokens": n, "positions": steps * batch, "batch": batch,
            "max_abs_dlogit": worst, "argmax_flips": flips, "min_top2_margin": margin}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from localflash.runner import config_from

    path = str(config_from(a.pair, None, None).target)
    if a.one is not None:
        print(json.dumps(measure(path, a.one, a.batch, a.steps)))
        return 0
    for t in (int(x) for x in a.threads.split(",")):
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        res = subprocess.run([sys.executable, __file__, "--pair", a.pair, "--batch", str(a.batch), "--steps", str(a.steps), "--one", str(t)],
                             capture_output=True, text=True, env=env, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"{Path(path).name}: threads {r['threads']}, {r['prompt_tokens']}-token prompt, {r['positions']} positions in "
              f"batches of {r['batch']}: max |Δlogit| {r['max_abs_dlogit']:.4g}, argmax flips {r['argmax_flips']}, "
              f"smallest top-2 margin {r['min_top2_margin']:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
