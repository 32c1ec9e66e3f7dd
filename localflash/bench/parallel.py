"""``localflash bench --parallel N``: aggregate throughput of N slots decoding together, per mode.

Each mode (``none`` = plain batched decoding, then each drafter) loads the pair with N slots and
runs the prompts through ``LLM.generate_batch`` (N at a time; the rest join as slots free up),
after one warm-up batch. Aggregate tok/s is every generated token over the batch's wall time;
per-stream tok/s is each request's tokens over its own prefill + decode time, averaged.
``same`` counts replies equal to plain batched decoding's, token for token.
"""

from __future__ import annotations

import time
from dataclasses import replace

from localflash.bench.prompts import BenchPrompt


def run_parallel_bench(cfg, modes: list[str], prompts: list[BenchPrompt], max_tokens: int, sampling, n_slots: int,
                       raw: bool = False, console=None) -> dict:
    from localflash.api import open_llm

    rows = []
    plain: list | None = None
    for mode in modes:
        llm = open_llm(replace(cfg, spec=mode, parallel=n_slots))
        try:
            kw = dict(max_tokens=max_tokens, sampling=sampling, raw=raw)
            texts = [p.text if raw else [{"role": "user", "content": p.text}] for p in prompts]
            llm.generate_batch(texts[:n_slots], **kw)  # warm-up: calibration, first prefills
            t0 = time.perf_counter()
            done = llm.generate_batch(texts, **kw)
            wall = time.perf_counter() - t0
        finally:
            llm.close()
        generated = sum(c.stats.generated for c in done)
        per_stream = [c.stats.generated / (c.stats.t_prefill + c.stats.t_decode) for c in done
                      if c.stats.t_prefill + c.stats.t_decode > 0]
        ids = [c.token_ids for c in done]
        if plain is None:
            plain = ids
        row = {"mode": mode, "slots": n_slots, "requests": len(done), "generated": generated, "wall_s": wall,
               "aggregate_tok_s": generated / wall if wall > 0 else 0.0,
               "per_stream_tok_s": sum(per_stream) / len(per_stream) if per_stream else 0.0,
               "tau": sum(c.stats.committed for c in done) / max(1, sum(c.stats.cycles for c in done)),
               "same_as_first_mode": sum(a == b for a, b in zip(ids, plain))}
        rows.append(row)
        if console is not None:
            console.print(f"[dim]{mode}: {generated} tokens in {wall:.1f} s[/]")
    base = rows[0]["aggregate_tok_s"] if rows else 0.0
    for r in rows:
        r["vs_first_mode"] = r["aggregate_tok_s"] / base if base else 1.0
    return {"slots": n_slots, "max_tokens": max_tokens, "modes": rows}


def print_parallel_report(report: dict, out) -> None:
    from rich.table import Table

    t = Table(title=f"{report['slots']} slots, {report['max_tokens']} tokens a request")
    for col in ("mode", "aggregate tok/s", "per-stream tok/s", "τ", f"vs {report['modes'][0]['mode']}", "same", "wall s"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for r in report["modes"]:
        t.add_row(r["mode"], f"{r['aggregate_tok_s']:.1f}", f"{r['per_stream_tok_s']:.1f}", f"{r['tau']:.2f}",
                  f"{r['vs_first_mode']:.2f}×", f"{r['same_as_first_mode']}/{r['requests']}", f"{r['wall_s']:.1f}")
    out.print(t)
