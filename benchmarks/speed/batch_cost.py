"""CPU time of one decode step carrying 1, 2, 3, 4 or 8 sequences (one row each), per weight type.

Process CPU time, not wall time, so a loaded machine changes little: what a step of N
sequences costs next to N one-sequence steps tells whether batching pays on this CPU for
this file (ggml's CPU kernels batch some weight types, e.g. Q4_0 repacked or Q8_0 through
sgemm, and multiply others row by row). One thread.

    .venv/bin/python benchmarks/speed/batch_cost.py MODEL.gguf [MODEL2.gguf ...]
"""

from __future__ import annotations

import sys
import time

from localflash.llama import Context, ContextOptions, Model, SeqView, decode_views

STEPS = 30


def step_cost(model: Model, n_seq: int) -> float:
    ctx = Context(model, ContextOptions(n_ctx=1024 * 8, n_outputs_max=64, n_threads=1, n_seq_max=8, kv_unified=False))
    toks = model.tokenize("Write a short paragraph about the sea and the sky and the wind.")
    views = [SeqView(ctx, i) for i in range(n_seq)]
    for v in views:
        v.decode(toks, 0, "last")
    t0 = time.process_time()
    for k in range(STEPS):
        decode_views(ctx, [(v, [toks[k % len(toks)]], len(toks) + k, False) for v in views])
    ctx.close()
    return (time.process_time() - t0) / STEPS


def main() -> int:
    for path in sys.argv[1:]:
        m = Model(path)
        one = step_cost(m, 1)
        line = [f"{m.path.name}: 1 seq {1000 * one:.1f} ms"]
        for n in (2, 3, 4, 8):
            c = step_cost(m, n)
            line.append(f"{n} seq {1000 * c:.1f} ms ({n * one / c:.2f}x the tokens per CPU second)")
        print(", ".join(line), flush=True)
        m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
