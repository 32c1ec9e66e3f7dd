#!/usr/bin/env python3
"""Plain sampled decoding on flat rows: top-k off + top-p 0.95 beside greedy and top-k 40, tok/s and µs per sampled row.

The model is loop_vs_peer.py's cheap random-weight ``llama`` (``--width`` 256,
``--layers`` 4, Q4_0, head Q6_K) carrying the Qwen2 tokenizer (151,936 tokens,
the sdist's ``models/ggml-vocab-qwen2.gguf``), with its output norm scaled by
``--norm-scale`` (default 0.05: logit std about 1.1, so top-p 0.95 keeps about
70% of the vocabulary at every step: flat rows, what an unsure model or a high
temperature gives; the kept shares are printed). Plain decoding
(``Engine.generate``, no drafter, ``--threads`` 1), the same prompt and token
budget for every setting:

- ``greedy``: ``--temp 0``
- ``topp95``: ``--temp 0.8 --top-k 0 --top-p 0.95`` (top-k off: what many OpenAI clients send)
- ``topk40``: ``--temp 0.8 --top-k 40``

tok/s is Stats' decode rate, (generated - 1) / t_decode (the prompt pass and its
token excluded). Runs interleave (greedy, topp95, topk40, greedy, ...)
``--rounds`` times; a setting's figure is its best run (a shared machine only
slows a run down), its ratio is to greedy's best. A second pass per sampled
setting times every Sampler call inside the same loop (this thread's CPU time:
other processes do not count), counts its paths (``Sampler.paths``: ``flat`` =
speculative/sampling_flat.py, ``flat-open`` = a decision within rounding left
to the book's sort, ``window`` etc. = kept_set's) and measures the share of the
vocabulary the book keeps on the first ``--kept-rows`` rows; ``alone`` is the
median over those rows of the same Sampler call outside the loop (best of 5
each): the row function's own cost, without the cold caches a decode leaves.

    .venv/bin/python benchmarks/speed/bench_flat_topp.py --json flat_topp.json
    .venv/bin/python benchmarks/speed/bench_flat_topp.py --rounds 1 --tokens 16   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench_host import _scale_tensor  # noqa: E402  (benchmarks/speed/, the script's own folder)
from loop_vs_peer import SDIST_VOCAB, write_models  # noqa: E402
from localflash.bench import rig as bl  # noqa: E402

SETTINGS = {  # name -> (temperature, top_k, top_p)
    "greedy": (0.0, 40, 1.0),
    "topp95": (0.8, 0, 0.95),
    "topk40": (0.8, 40, 1.0),
}
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def flat_model(work: Path, width: int, layers: int, norm_scale: float, qwen2_vocab: Path) -> Path:
    """loop_vs_peer's Qwen2-vocabulary target, copied with its output norm scaled (kept if already written)."""
    target, _ = write_models(work, "qwen2", [], width, layers, qwen2_vocab)
    flat = target.with_name(f"{target.stem}-norm{norm_scale:g}.gguf")
    if not flat.exists():
        shutil.copy(target, flat)
        _scale_tensor(flat, "output_norm.weight", norm_scale)
    return flat


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128, help="tokens per run (default 128)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved runs per setting; the best counts (default 5)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--norm-scale", type=float, default=0.05, help="output norm scale (default 0.05: flat rows)")
    ap.add_argument("--kept-rows", type=int, default=16, help="rows whose kept share the book measures (default 16)")
    ap.add_argument("--peer-dir", default=os.environ.get("PEER_DIR", str(bl.ROOT / "peer")), help="scripts/build_peer.sh's PEER_DIR")
    ap.add_argument("--qwen2-vocab", default=None, help=f"the Qwen2 tokenizer GGUF (default: PEER_DIR/{SDIST_VOCAB})")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "localflash" / "bench_flat_topp"))
    ap.add_argument("--json", default=None, help="write the report as JSON here")
    a = ap.parse_args(argv)
    qwen2_vocab = Path(a.qwen2_vocab or Path(a.peer_dir) / SDIST_VOCAB)
    if not qwen2_vocab.exists():
        print(f"error: no {qwen2_vocab} (the Qwen2 tokenizer: pass --qwen2-vocab)", file=sys.stderr)
        return 1
    bl.set_omp_wait("passive")
    from localflash.llama import Context, ContextOptions, Model
    from localflash.speculative import loop
    from localflash.speculative.sampling import Sampler, SamplingParams, reference_distribution
    from localflash.speculative.stats import Stats

    path = flat_model(Path(a.work), a.width, a.layers, a.norm_scale, qwen2_vocab)
    model = Model(path)
    ctx = Context(model, ContextOptions(n_ctx=512, n_outputs_max=1, n_threads=a.threads))
    engine = loop.Engine(model, ctx, None, adaptive=False, draft_max=0)
    prompt = bl.render(model, PROMPT)[1]
    params = {name: SamplingParams(t, k, p, seed=1) for name, (t, k, p) in SETTINGS.items()}

    def tok_s(sp) -> float:
        st = Stats()
        for _ in engine.generate(prompt, a.tokens, sp, stats=st):
            pass
        return (st.generated - 1) / st.t_decode

    print(f"{path.name}: {model.n_vocab} tokens, {a.tokens} tokens per run, {a.rounds} rounds, {a.threads} thread(s)", flush=True)
    load0 = os.getloadavg()
    best = {name: 0.0 for name in SETTINGS}
    for _ in range(a.rounds):
        for name, sp in params.items():
            best[name] = max(best[name], tok_s(sp))
    load1 = os.getloadavg()

    untimed, seen = Sampler.__call__, []

    def timed(self, logits):  # every Sampler call in the loop, timed; the request's first rows kept for the book
        if not seen or seen[-1][0] is not self:
            seen.append((self, [], []))
        t = time.thread_time()
        tok = untimed(self, logits)
        times, rows = seen[-1][1], seen[-1][2]
        times.append(time.thread_time() - t)
        if len(rows) < a.kept_rows:
            rows.append(logits.copy())
        return tok

    def alone_us(sp, rows) -> list[float]:
        """Each kept row sampled alone, outside the loop (best of 5, this thread's CPU time): the row function's
        own cost, without the caches the decode between rows empties."""
        s = Sampler(sp)
        untimed(s, rows[0])  # the state a row in the loop meets (after a flat row: no window first)
        out = []
        for r in rows:
            best = float("inf")
            for _ in range(5):
                t = time.thread_time()
                untimed(s, r)
                best = min(best, time.thread_time() - t)
            out.append(best * 1e6)
        return out

    report = {"model": path.name, "vocab": model.n_vocab, "tokens": a.tokens, "rounds": a.rounds, "threads": a.threads,
              "norm_scale": a.norm_scale, "loadavg_before": list(load0), "loadavg_after": list(load1), "settings": {}}
    print(f"{'setting':8s} {'tok/s':>8s} {'x greedy':>9s} {'µs/row med':>11s} {'p90':>7s} {'alone':>7s} {'kept share':>11s}  paths")
    Sampler.__call__ = timed
    try:
        for name, sp in params.items():
            row = {"tok_s": best[name], "ratio": best[name] / best["greedy"]}
            if not sp.greedy:
                tok_s(sp)
                sampler, times, rows = seen[-1]
                us = sorted(t * 1e6 for t in times[1:])  # [0]: the prefill row
                shares = [len(reference_distribution(r, sp)[0]) / len(r) for r in rows]
                row.update(us_median=statistics.median(us), us_p90=us[int(0.9 * (len(us) - 1))], paths=dict(sampler.paths),
                           kept_share_median=statistics.median(shares), kept_share_min=min(shares),
                           us_alone_median=statistics.median(alone_us(sp, rows[1:])))
            report["settings"][name] = row
            extra = (f"{row['us_median']:11.0f} {row['us_p90']:7.0f} {row['us_alone_median']:7.0f} "
                     f"{row['kept_share_median']:11.2f}  {row['paths']}" if "paths" in row else f"{'':11s} {'':7s} {'':7s} {'':11s}")
            print(f"{name:8s} {row['tok_s']:8.1f} {row['ratio']:9.2f} {extra}", flush=True)
    finally:
        Sampler.__call__ = untimed
    print(f"load average {load0[0]:.2f} before, {load1[0]:.2f} after the timed rounds")
    engine.close()
    if a.json:
        report["machine"] = bl.machine_info()
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
