#!/usr/bin/env python3
"""Constrained decoding with drafting against constrained plain decoding, and the grammar's host cost per cycle.

One process, one loaded pair (default ``demo``: SmolLM2-135M + its DFlash drafter), the same prompts:
each constraint (a JSON schema, a GBNF grammar, and none for reference) is decoded greedily with the
pair's drafter (a fixed draft length unless ``--adaptive``) and with drafting off for that request (``draft_max=0``), on the same LLM. Reported:
decode tokens/s of each, the ratio drafting / plain (one run), τ, the draft tokens the grammar cut
before verify, and the grammar's host cost per cycle: wall µs inside speculative/grammar.py's sampler
(row masks, candidate checks, draft checks; ``Stats.t_grammar``), C calls into llama.cpp's grammar
sampler (``Stats.grammar_calls``) and Python function calls in the two grammar modules (cProfile,
counted in a separate profiled pass, so the timed pass runs unprofiled). The greedy replies with and
without drafting are compared (they must be equal). Timings depend on the machine's load: the
``uptime`` load average is printed with them.

    .venv/bin/python benchmarks/speed/bench_constrained.py
    .venv/bin/python benchmarks/speed/bench_constrained.py --pair demo --tokens 96 --threads 2 --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats

from localflash.api import load
from localflash.testing.constrained import GBNF, SCHEMA

PROMPTS = [
    "Describe a cat as JSON with its name, whether it is ok and its colour.",
    "Give me a JSON record of a red car.",
    "Write a list of short words.",
    "List four numbers.",
]
CONSTRAINTS = {"none": {}, "json_schema": {"json_schema": SCHEMA}, "grammar": {"grammar": GBNF}}
GRAMMAR_FILES = ("speculative/grammar.py", "llama/grammar.py")


def run(llm, kw: dict, draft_max: int | None, tokens: int) -> dict:
    agg = dict(generated=0, t_decode=0.0, cycles=0, drafted=0, accepted=0, t_grammar=0.0, grammar_calls=0, rejected=0)
    texts = []
    for p in PROMPTS:
        c = llm.chat(p, max_tokens=tokens, draft_max=draft_max, **kw)
        st = c.stats
        texts.append(c.token_ids)
        agg["generated"] += st.generated
        agg["t_decode"] += st.t_decode
        agg["cycles"] += st.cycles
        agg["drafted"] += st.drafted
        agg["accepted"] += st.accepted
        agg["t_grammar"] += st.t_grammar
        agg["grammar_calls"] += st.grammar_calls
        agg["rejected"] += st.grammar_rejected
    agg["tok_s"] = agg["generated"] / agg["t_decode"] if agg["t_decode"] else 0.0
    agg["tau"] = (agg["accepted"] + agg["cycles"]) / agg["cycles"] if agg["cycles"] else 0.0
    agg["grammar_us_per_cycle"] = 1e6 * agg["t_grammar"] / agg["cycles"] if agg["cycles"] else 0.0
    agg["grammar_c_calls_per_cycle"] = agg["grammar_calls"] / agg["cycles"] if agg["cycles"] else 0.0
    agg["ids"] = texts
    return agg


def python_calls(llm, kw: dict, draft_max: int | None, tokens: int) -> float:
    """Python function calls per cycle in the grammar modules (a profiled pass)."""
    prof = cProfile.Profile()
    prof.enable()
    agg = run(llm, kw, draft_max, tokens)
    prof.disable()
    stats = pstats.Stats(prof).stats
    calls = sum(pc for (path, _, _), (pc, _, _, _, _) in stats.items() if path.replace("\\", "/").endswith(GRAMMAR_FILES))
    return calls / agg["cycles"] if agg["cycles"] else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--draft-max", type=int, default=4, help="the drafting runs' draft length")
    ap.add_argument("--adaptive", action="store_true", help="the adaptive draft length (default: fixed, so every cycle drafts)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    load_avg = os.getloadavg()
    rows = {}
    with load(pair=a.pair, threads=a.threads, fixed=not a.adaptive, draft_max=a.draft_max) as llm:
        llm.chat(PROMPTS[0], max_tokens=8)  # warm-up (the adaptive draft length's calibration)
        for name, kw in CONSTRAINTS.items():
            plain = run(llm, kw, 0, a.tokens)
            spec = run(llm, kw, a.draft_max, a.tokens)
            row = {"plain": plain, "drafting": spec, "ratio": spec["tok_s"] / plain["tok_s"] if plain["tok_s"] else 0.0,
                   "equal": plain["ids"] == spec["ids"]}
            if kw:
                row["py_calls_per_cycle_drafting"] = python_calls(llm, kw, a.draft_max, a.tokens)
                row["py_calls_per_cycle_plain"] = python_calls(llm, kw, 0, a.tokens)
            rows[name] = row
    print(f"pair {a.pair}, {len(PROMPTS)} prompts x {a.tokens} tokens, greedy, draft length {a.draft_max} "
          f"{'adaptive' if a.adaptive else 'fixed'}; load average {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f} "
          f"(timings on a busy machine are indicative only)")
    print(f"{'constraint':<12} {'plain tok/s':>11} {'draft tok/s':>11} {'ratio':>6} {'tau':>5} {'cut':>4} {'equal':>5} "
          f"{'us/cyc plain':>12} {'us/cyc draft':>12} {'C/cyc plain':>11} {'C/cyc draft':>11} {'py/cyc plain':>12} {'py/cyc draft':>12}")
    for name, r in rows.items():
        p, s = r["plain"], r["drafting"]
        print(f"{name:<12} {p['tok_s']:>11.1f} {s['tok_s']:>11.1f} {r['ratio']:>6.2f} {s['tau']:>5.2f} {s['rejected']:>4} {str(r['equal']):>5} "
              f"{p['grammar_us_per_cycle']:>12.0f} {s['grammar_us_per_cycle']:>12.0f} {p['grammar_c_calls_per_cycle']:>11.1f} "
              f"{s['grammar_c_calls_per_cycle']:>11.1f} {r.get('py_calls_per_cycle_plain', 0):>12.1f} {r.get('py_calls_per_cycle_drafting', 0):>12.1f}")
    if a.json:
        for r in rows.values():
            r["plain"].pop("ids"), r["drafting"].pop("ids")
        with open(a.json, "w") as f:
            json.dump({"pair": a.pair, "tokens": a.tokens, "load_average": load_avg, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
