#!/usr/bin/env python3
"""Sampling options side by side: CPU µs per verified row, on real logits, at 151,936 and 248,320 tokens.

Rows are real: one 16-token verify batch of Qwen2.5-Coder-0.5B (vocabulary
151,936) per prompt, over a few Spec-Bench-like prompts. For the 248,320
column (Qwen3.5/3.6's vocabulary) each row is extended with logits drawn from
its own lower 90% (the tail a bigger vocabulary adds; the top of the row is
unchanged). Options:

- ``old``: the sampler of main at 5515589 (full argpartition/lexsort; top-k off sorts the vocabulary)
- ``window``: localflash's sampler now (sort only the tokens near the top, exact fallbacks)
- ``window-vec``: the same window found for all 16 rows of a block in one NumPy pass
  (a block's rows at once; sequential sampling reads only τ rows of them)
- ``native``: llama.cpp's sampler chain on the host (``llama_sampler_sample``; 151,936 only: it reads the context)
- ``backend``: the chain attached to the target context (``llama_set_sampler``): extra ``llama_decode``
  time per row for the 16-row batch, against the same decode without it (on a GPU this runs on the device)

    .venv/bin/python benchmarks/speed/bench_sampling.py
    .venv/bin/python benchmarks/speed/bench_sampling.py --model PATH.gguf --prompts 2
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path

import numpy as np  # noqa: E402

from localflash.bench import rig as bl  # noqa: E402
from bench_host import SAMPLING, OldSampler  # noqa: E402

TEXTS = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Summarize the causes of the French Revolution in three sentences.",
    "What is 17 times 23? Explain your steps.",
    "Translate to German: The weather is nice today and we are going to the lake.",
]
QWEN36_VOCAB = 248320


def per_row(fn, rows, number=3) -> float:
    """Best-of-3 mean µs per row of ``fn(row)`` over ``rows``."""
    def once():
        for r in rows:
            fn(r)
    return min(timeit.repeat(once, number=number, repeat=3, timer=time.thread_time)) / number / len(rows) * 1e6


def widen(rows: np.ndarray, vocab: int, rng) -> np.ndarray:
    out = np.empty((rows.shape[0], vocab), np.float32)
    for i, r in enumerate(rows):
        low = np.sort(r)[: int(0.9 * len(r))]
        out[i, : len(r)] = r
        out[i, len(r) :] = rng.choice(low, size=vocab - len(r))
    return out


def window_vec(block: np.ndarray, params, delta: float = 16.0) -> list[np.ndarray]:
    """Candidate ids of every row of a block in one pass (the per-row sort and checks then follow)."""
    top = block.max(axis=1)
    r, c = np.nonzero(block >= (top - delta)[:, None])
    return np.split(c, np.searchsorted(r, np.arange(1, block.shape[0])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache" / "localflash" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    bl.set_omp_wait("passive")
    from localflash.llama import Context, ContextOptions, Model
    from localflash.llama.sampler_chain import SamplerChain
    from localflash.speculative.sampling import Sampler, SamplingParams, kept_set

    model = Model(a.model)
    ctx = Context(model, ContextOptions(n_ctx=512, n_outputs_max=16, n_threads=a.threads))
    batches, rows = [], []
    for text in TEXTS[: a.prompts]:
        toks = bl.render(model, text)[1]
        ctx.clear()
        ctx.decode(toks[:-16], 0, "none")
        batches.append((toks[-16:], len(toks) - 16))
        ctx.decode(toks[-16:], len(toks) - 16, "all")
        rows.append(ctx.all_logits().copy())
    real = np.concatenate(rows)
    wide = widen(real, QWEN36_VOCAB, np.random.default_rng(0))
    print(f"{len(real)} real rows of {model.path.name} ({model.n_vocab} tokens); widened copies at {QWEN36_VOCAB}")
    print(f"{'setting':8s} {'vocab':>7s} {'kept (median/max)':>18s} {'old':>9s} {'window':>8s} {'window-vec':>11s} {'native':>8s} {'backend':>8s}  (µs per row)")
    for name, (temp, top_k, top_p, min_p) in SAMPLING.items():
        sp = SamplingParams(temp, top_k, top_p, min_p, seed=1)
        for label, data in (("real", real), ("wide", wide)):
            old = OldSampler(sp)
            new = Sampler(sp)
            t_old = per_row(old, data[:16] if name == "topp95" else data, number=1)
            t_new = per_row(new, data)
            if name == "greedy":
                t_vec = min(timeit.repeat(lambda: [b.argmax(axis=1) for b in np.split(data, len(data) // 16)], number=3, repeat=3, timer=time.thread_time)) / 3 / len(data) * 1e6
                kept = "1"
            else:
                t_vec = min(timeit.repeat(lambda: [window_vec(b, sp) for b in np.split(data, len(data) // 16)], number=3, repeat=3, timer=time.thread_time)) / 3 / len(data) * 1e6
                sizes = [len(kept_set(r, sp)[0]) for r in data]
                kept = f"{int(np.median(sizes))}/{max(sizes)}"
            t_nat = t_back = float("nan")
            if label == "real":
                t_nat, t_back = native_and_backend(model, ctx, batches, sp, SamplerChain, a.threads, Context, ContextOptions)
            print(f"{name:8s} {data.shape[1]:7d} {kept:>18s} {t_old:9.1f} {t_new:8.1f} {t_vec:11.1f} {t_nat:8.1f} {t_back:8.1f}", flush=True)
    ctx.close()
    return 0


def native_and_backend(model, ctx, batches, sp, SamplerChain, threads, Context, ContextOptions) -> tuple[float, float]:
    """µs per row: llama.cpp's chain on the host; its backend form as extra decode time per row."""
    chain = SamplerChain(sp.temperature, sp.top_k, sp.top_p, sp.min_p, seed=1)
    host = []
    for toks, pos in batches:
        ctx.seq_rm(pos)
        ctx.decode(toks, pos, "all")
        t = time.thread_time()
        for i in range(16):
            chain.sample(ctx, i)
        host.append((time.thread_time() - t) / 16)
    chain.close()
    # backend: the same batch decoded with and without the chain in the graph, best of 3 each
    bctx = Context(model, ContextOptions(n_ctx=512, n_outputs_max=16, n_threads=threads))
    bchain = SamplerChain(sp.temperature, sp.top_k, sp.top_p, sp.min_p, seed=1)

    def decode_time(c) -> float:
        best = float("inf")
        for toks, pos in batches:
            c.clear()
            c.decode(list(range(10, 10 + pos)), 0, "none")
            for _ in range(3):
                t = time.thread_time()  # one llama.cpp thread: the compute runs on this one
                c.decode(toks, pos, "all")
                best = min(best, time.thread_time() - t)
                c.seq_rm(pos)
        return best

    plain = decode_time(bctx)
    if not bchain.attach(bctx):
        bctx.close()
        bchain.close()
        return 1e6 * min(host), float("nan")
    with_chain = decode_time(bctx)
    bctx.close()
    bchain.close()
    return 1e6 * min(host), 1e6 * (with_chain - plain) / 16


if __name__ == "__main__":
    sys.exit(main())
