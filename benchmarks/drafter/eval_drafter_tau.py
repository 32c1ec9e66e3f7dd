"""τ of a DFlash drafter vs n-gram drafting on Spec-Bench categories and HumanEval (greedy).

    .venv/bin/python benchmarks/drafter/eval_drafter_tau.py [--pair demo] [--per-category 10] [--max-tokens 128]

Spec-Bench's 13 categories are grouped into its 6 (the 8 MT-Bench ones are
"mt_bench"); the first turn of the first N prompts of each (MT-Bench: spread
over its sub-categories), and the first N HumanEval problems wrapped as the
DFlash benchmark does. Each prompt is rendered with the chat template and
decoded greedily to --max-tokens, through the same engine as `localflash run`.
Configurations: n-gram (draft 8, fixed), DFlash with the full block (15
drafts, fixed), DFlash with the adaptive draft length, and prompt lookup
first with DFlash where it finds nothing (``--spec dflash+ngram``, block 16,
fixed; it contains n-gram drafting, so only the DFlash-alone column measures
the drafter against n-gram). Prints a Markdown
table; --json writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from localflash.bench.prompts import HUMANEVAL_DFLASH_INSTRUCTION, SPEC_BENCH_GROUPS as GROUPS, humaneval as humaneval_prompts, spec_bench_groups


def spec_bench(per: int) -> dict[str, list[str]]:
    """The first ``per`` prompts of each Spec-Bench group (MT-Bench: round-robin over its sub-categories)."""
    prompts = spec_bench_groups(per, spread_mt_bench=True)
    return {g: [p.text for p in prompts if p.category == g] for g in GROUPS}


def humaneval(per: int) -> list[str]:
    """The first ``per`` HumanEval problems, wrapped as the DFlash benchmark does."""
    return [p.text for p in humaneval_prompts(per, HUMANEVAL_DFLASH_INSTRUCTION, strip=True)]


def main() -> None:
    from localflash.registry.pairs import get_pair
    from localflash.train.evaluate import measure_tau

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--target")
    ap.add_argument("--drafter")
    ap.add_argument("--per-category", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    pair = get_pair(args.pair)
    target = Path(args.target) if args.target else pair.target
    drafter = Path(args.drafter) if args.drafter else pair.drafter
    if drafter is None or not drafter.exists():
        sys.exit(f"no DFlash drafter file: {drafter}")
    sets = spec_bench(args.per_category)
    sets["humaneval"] = humaneval(args.per_category)
    configs = [
        ("ngram", "ngram", None, 8, False),
        ("dflash16", "dflash", drafter, 15, False),
        ("dflash_adaptive", "dflash", drafter, 15, True),
        ("dflash16_lookup", "dflash+ngram", drafter, 15, False),
    ]
    results: dict[str, dict[str, dict]] = {}
    t0 = time.time()
    for name, prompts in sets.items():
        results[name] = {}
        for label, kind, path, dmax, adaptive in configs:
            rep = measure_tau(target, prompts, path, kind, args.max_tokens, draft_max=dmax, adaptive=adaptive, threads=args.threads, label=label)
            st = rep.stats
            results[name][label] = {"tau": st.tau, "acceptance": st.acceptance, "tok_s": st.decode_tps, "prompts": len(rep.per_prompt),
                                    "generated": st.generated, "position_acceptance": st.position_acceptance[:8]}
            print(f"[{time.time() - t0:6.0f}s] {name:15s} {label:16s} τ {st.tau:.2f}  accept {100 * st.acceptance:4.1f}%  "
                  f"{st.decode_tps:6.1f} tok/s  ({len(rep.per_prompt)} prompts)", file=sys.stderr, flush=True)
    lines = [
        ("| set | prompts | n-gram τ (draft 8) | DFlash τ (block 16) | DFlash τ (adaptive) | DFlash accept. (block 16) "
         "| lookup first, then DFlash: τ (block 16) | tok/s n-gram / block 16 / adaptive |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        n, d, a, h = r["ngram"], r["dflash16"], r["dflash_adaptive"], r["dflash16_lookup"]
        lines.append(f"| {name} | {d['prompts']} | {n['tau']:.2f} | {d['tau']:.2f} | {a['tau']:.2f} | {100 * d['acceptance']:.1f}% | "
                     f"{h['tau']:.2f} | {n['tok_s']:.0f} / {d['tok_s']:.0f} / {a['tok_s']:.0f} |")
    wins = sum(results[g]["dflash16"]["tau"] > results[g]["ngram"]["tau"] for g in GROUPS)
    lookup_wins = sum(results[g]["dflash16_lookup"]["tau"] > results[g]["ngram"]["tau"] for g in GROUPS)
    lines.append("")
    lines.append(f"DFlash alone (block 16) beats n-gram τ on {wins} of the {len(GROUPS)} Spec-Bench categories; "
                 f"lookup first, then DFlash (--spec dflash+ngram) on {lookup_wins}.")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"target": str(target), "drafter": str(drafter), "max_tokens": args.max_tokens,
                                         "per_category": args.per_category, "results": results}, indent=1))


if __name__ == "__main__":
    main()
