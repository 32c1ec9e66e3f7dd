"""τ of tree vs chain verification at the same row budget per pass, per verified row (counts, not timings).

For each prompt, one target model serves five engines: plain decoding, and a chain and a tree at
each of ``--rows`` target rows per verify (a chain of ``rows - 1`` drafts; a tree of ``rows - 1``
drafted nodes, at most ``rows - 1`` deep), all greedy with a fixed length (``--fixed``), so τ is
the drafter's alone. The budget is the same, the rows verified are not (a chain is cut by the token
limit near the end, a DFlash tree by its 16 leaves): the ratio to read is τ per verified row. ``same`` counts the replies equal to plain decoding's token for token (claimed
only with ``--exact``). Prints a markdown table; ``--json`` writes the per-mode totals.

    python benchmarks/speed/tree_tau.py --pair demo --prompts spec_bench --limit 3 --exact
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from localflash.bench.prompts import load_prompts
from localflash.config import config_from_options
from localflash.engine import open_engine
from localflash.llama import Model, ModelOptions
from localflash.prompt import render_chat, tokenize_prompt
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--prompts", default="spec_bench")
    ap.add_argument("--limit", type=int, default=3, help="prompts per category (0: all)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rows", default="8,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    base = config_from_options(pair=a.pair, threads=a.threads, fixed=True, exact=a.exact)
    set_name, prompts = load_prompts(a.prompts, a.limit or None)
    target = Model(base.target, ModelOptions(use_extra_bufts=not a.exact))
    toks = [tokenize_prompt(target, render_chat(target, [{"role": "user", "content": p.text}])) for p in prompts]
    ctx = min(base.ctx, max(len(t) for t in toks) + a.max_tokens + 64)
    modes = {"plain": replace(base, ctx=ctx, spec="none")}
    for r in rows:
        modes[f"chain {r}"] = replace(base, ctx=ctx, draft_max=r - 1, tree=0)
        modes[f"tree {r}"] = replace(base, ctx=ctx, draft_max=r - 1, tree=r - 1)
    engines = {m: open_engine(cfg, target=target) for m, cfg in modes.items()}
    totals = {m: Stats() for m in modes}
    same = {m: 0 for m in modes}
    try:
        for i, t in enumerate(toks):
            outs = {}
            for m, eng in engines.items():
                st = Stats()
                outs[m] = [x for new in eng.generate(t, a.max_tokens, SamplingParams(), st) for x in new]
                totals[m].merge(st)
                same[m] += outs[m] == outs["plain"]
            print(f"{i + 1}/{len(toks)} {prompts[i].category}", file=sys.stderr, flush=True)
            if a.json:  # after every prompt: a run cut short still leaves its figures so far
                with open(a.json, "w") as f:
                    json.dump({"pair": a.pair, "set": set_name, "n": i + 1, "of": len(toks), "exact": a.exact,
                               "load": os.getloadavg(), "same_as_plain": same,
                               "modes": {m: st.to_dict() for m, st in totals.items()}}, f, indent=1)
    finally:
        for eng in engines.values():
            eng.close()
    load = os.getloadavg()
    print(f"{a.pair}, {set_name}: {len(toks)} prompts x {a.max_tokens} tokens, greedy, fixed length, "
          f"{'exact' if a.exact else 'not exact'}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| mode | rows/pass | τ | τ per row | tree nodes | same as plain |")
    print("|---|---|---|---|---|---|")
    for m, st in totals.items():
        print(f"| {m} | {st.rows / st.cycles:.2f} | {st.tau:.3f} | {st.tau_per_row:.3f} | "
              f"{st.mean_tree_nodes:.1f} | {same[m]}/{len(toks)} |")
    for r in rows:  # the chain is cut by the token limit near the end, the tree is not: compare per verified row
        c, t = totals[f"chain {r}"], totals[f"tree {r}"]
        print(f"--rows {r}: chain {c.rows / c.cycles:.2f} rows/pass, tree {t.rows / t.cycles:.2f}; "
              f"tree/chain τ per verified row {t.tau_per_row / c.tau_per_row:.3f} (per pass {t.tau / c.tau:.3f})")


if __name__ == "__main__":
    main()
