#!/usr/bin/env python3
"""Decode speed of localflash's low-level runtime next to llama-cpp-python's high-level ``Llama``.

Both load the same GGUF with the same threads, context size and flash
attention, and decode the same prompts greedily for the same number of new
tokens; the two take turns on every prompt (the order alternates), so drift of
a shared machine hits both alike. Decode tok/s = (tokens after the first) /
(time from the first token to the last), i.e. prefill excluded, for both.
The outputs are compared token for token as a sanity check.

    .venv/bin/python benchmarks/speed/bench_decode.py                 # SmolLM2 (pair demo), 6 prompts x 128 tokens
    .venv/bin/python benchmarks/speed/bench_decode.py --pair qwen-coder --prompts 3 --tokens 64
    .venv/bin/python benchmarks/speed/bench_decode.py --model X.gguf --json out.json

Not a test: it prints numbers and exits 0 unless something fails to run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from localflash.errors import LocalflashError  # noqa: E402


def bench_prompts(n: int) -> list[str]:
    """``n`` Spec-Bench first turns spread over its categories (the first 400 characters of each)."""
    from localflash.bench.prompts import prompt_set_rows

    rows = prompt_set_rows("spec_bench")
    picked = rows[:: max(1, len(rows) // n)][:n]
    return [r["turns"][0][:400] for r in picked]


def run_ours(engine, tokens: list[int], n: int) -> tuple[list[int], float]:
    """Greedy decode through the engine's plain path; returns tokens and decode seconds after the first token."""
    out: list[int] = []
    t_first = None
    for chunk in engine.generate(tokens, n):
        if t_first is None:
            t_first = time.perf_counter()
        out += chunk
    return out, (time.perf_counter() - t_first) if t_first is not None else 0.0


def run_llama(llm, is_eog, tokens: list[int], n: int) -> tuple[list[int], float]:
    out: list[int] = []
    t_first = None
    for tok in llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        if is_eog(tok):
            break
        out.append(tok)
        if len(out) == n:
            break
    return out, (time.perf_counter() - t_first) if t_first is not None else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--pair", default=None, help="a models.toml pair; its target is measured (default: demo)")
    src.add_argument("--model", default=None, help="a GGUF file")
    ap.add_argument("--prompts", type=int, default=6, help="Spec-Bench prompts (default 6)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts (default 1)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("LOCALFLASH_THREADS", "1")),
                    help="llama.cpp threads (default 1: see docs/benchmarks.md on threads and shared cores)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--omp-wait", choices=("passive", "active", "default"), default="passive",
                    help="OpenMP wait policy (default passive: see localflash/bench/rig.set_omp_wait)")
    a = ap.parse_args(argv)
    from localflash.bench import rig

    rig.set_omp_wait(a.omp_wait)
    from llama_cpp import Llama

    from localflash.llama import Context, ContextOptions, Model
    from localflash.config import config_from
    from localflash.speculative.loop import Engine

    path = Path(a.model) if a.model else config_from(a.pair or "demo", None, None).target
    model = Model(path)
    engine = Engine(model, Context(model, ContextOptions(n_ctx=a.ctx, n_threads=a.threads)))
    # our contexts run flash attention (AUTO resolves to on for these models); give Llama the same
    llm = Llama(model_path=str(path), n_ctx=a.ctx, n_threads=a.threads, n_threads_batch=a.threads, flash_attn=True, verbose=False)

    prompts = [model.tokenize(p) for p in bench_prompts(a.prompts)]
    # warm-up: page the weights in for both
    run_ours(engine, prompts[0], 8)
    run_llama(llm, model.is_eog, prompts[0], 8)

    tok = {"localflash": 0, "Llama": 0}
    sec = {"localflash": 0.0, "Llama": 0.0}
    per_prompt = []
    same = 0
    for r in range(a.repeats):
        for i, toks in enumerate(prompts):
            order = ["localflash", "Llama"] if (i + r) % 2 == 0 else ["Llama", "localflash"]
            got = {}
            for who in order:
                got[who] = run_ours(engine, toks, a.tokens) if who == "localflash" else run_llama(llm, model.is_eog, toks, a.tokens)
            same += got["localflash"][0] == got["Llama"][0]
            if min(len(o) for o, _ in got.values()) < 2:
                print(f"prompt {i + 1:2d}: ends at once (end of generation), not timed", file=sys.stderr)
                continue
            for who, (out, dt) in got.items():
                tok[who] += len(out) - 1
                sec[who] += dt
            row = {w: (len(o) - 1) / d if d > 0 else 0.0 for w, (o, d) in got.items()}
            per_prompt.append(row)
            print(
                f"prompt {i + 1:2d}: {len(toks):4d} tok in, {len(got['localflash'][0]):4d} out | "
                f"localflash {row['localflash']:7.1f} tok/s | Llama {row['Llama']:7.1f} tok/s | "
                f"ratio {row['localflash'] / row['Llama']:.3f} | same output: {got['localflash'][0] == got['Llama'][0]}",
                file=sys.stderr,
            )
    ours = tok["localflash"] / sec["localflash"]
    theirs = tok["Llama"] / sec["Llama"]
    ratios = [p["localflash"] / p["Llama"] for p in per_prompt if p["Llama"] > 0]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model        {path.name} ({model.n_params / 1e6:.0f}M params, {model.size_bytes / 2**20:.0f} MiB), {a.threads} threads")
    print(f"prompts      {len(prompts)} x {a.repeats} pass(es), {a.tokens} new tokens, greedy; load average {load:.2f}")
    print(f"localflash   {ours:8.2f} tok/s   (low-level runtime, Engine plain path)")
    print(f"Llama        {theirs:8.2f} tok/s   (llama-cpp-python high-level generate)")
    print(f"ratio        {ours / theirs:8.3f}        (localflash / Llama; median per prompt {statistics.median(ratios):.3f})")
    print(f"same output  {same}/{len(prompts) * a.repeats} prompts token for token")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "model": str(path), "threads": a.threads, "tokens": a.tokens, "prompts": len(prompts),
                    "repeats": a.repeats, "localflash_tok_s": ours, "llama_tok_s": theirs, "ratio": ours / theirs,
                    "median_ratio": statistics.median(ratios), "same_output": same, "cases": len(prompts) * a.repeats,
                    "per_prompt": per_prompt, "loadavg_1m": load,
                },
                indent=2,
            )
        )
    engine.close()
    llm.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LocalflashError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
