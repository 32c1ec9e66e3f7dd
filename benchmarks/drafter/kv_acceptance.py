#!/usr/bin/env python3
"""Acceptance and τ of every drafter kind with the target's and the drafter's KV cache at f16, q8_0 and q4_0.

Pairs: the demo pair (SmolLM2-135M-Instruct Q4_1 + the shipped DFlash drafter), demo-draft (SmolLM2 with its
Q2_K requantization as draft model) and tiny random-weight pairs for the kinds the demo pairs do not cover:
DSpark (Markov head set to the tiny target's bigram), EAGLE-3 (echoing), MTP (a qwen35 hybrid whose MTP block
mostly repeats the trunk's guess) and a draft model (the target plus a little noise). Greedy, fixed draft length
(``--fixed``), one thread; for every (target KV, drafter KV) of the grid the same prompts. MTP's "drafter KV"
is its MTP context's cache. Acceptance = accepted / drafted; τ = committed tokens per target pass.

    .venv/bin/python benchmarks/drafter/kv_acceptance.py [--prompts 6] [--tokens 64] [--kinds dflash,draft,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

KVS = ("f16", "q8_0", "q4_0")


def tiny_pairs(work: Path) -> dict[str, dict]:
    from localflash.formats.dflash_gguf import DSparkSpec
    from localflash.testing.tiny import Eagle3Spec, HybridSpec, TinySpec, write_dspark, write_eagle3, write_hybrid, write_target

    # two heads of 32: a quantized KV cache needs head dims in whole blocks of 32
    target = write_target(work / "target.gguf", TinySpec(n_layer=4, n_head=2, n_head_kv=2, seed=0))
    hybrid = write_hybrid(work / "qwen35-mtp.gguf", HybridSpec(seed=1, n_nextn=1, mtp_agree=0.3))
    return {
        "dspark": dict(model=target, drafter=write_dspark(work / "dspark.gguf", DSparkSpec(n_head=2, n_head_kv=2, target_layers=[1, 2, 3], seed=6), agree_with=target),
                       spec="dflash", label="tiny llama + DSpark (bigram Markov head)"),
        "eagle3": dict(model=target, drafter=write_eagle3(work / "eagle3.gguf", Eagle3Spec(n_head=2, n_head_kv=2, echo=4.0, fc_scale=0.3)), spec="eagle3",
                       label="tiny llama + EAGLE-3 (echo)", draft_max=4),
        "mtp": dict(model=hybrid, spec="mtp", label="tiny qwen35 + its MTP block", draft_max=3),
        "draft-tiny": dict(model=target, drafter=write_target(work / "draft-near.gguf", TinySpec(n_layer=4, n_head=2, n_head_kv=2, seed=0, noise=0.1)),
                           spec="draft", label="tiny llama + noisy copy (draft model)", draft_max=6),
    }


def word_prompts(n: int) -> list[str]:
    from localflash.testing.prompts import word_prompts as wp

    return wp(n, seed=11)


def chat_prompts(n: int) -> list[str]:
    from localflash.bench.prompts import spec_bench_groups

    return [p.text for p in spec_bench_groups(max(1, n // 6 + 1), spread_mt_bench=True)][:n]


def measure(opts: dict, prompts: list[str], tokens: int, chat: bool, kv: str, kv_drafter: str) -> dict:
    from localflash.api import load

    kw = {k: v for k, v in opts.items() if k not in ("label",)}
    with load(**kw, kv=kv, kv_drafter=kv_drafter, fixed=True, threads=1) as llm:
        drafted = accepted = committed = cycles = 0
        for p in prompts:
            c = llm.chat([{"role": "user", "content": p}], max_tokens=tokens) if chat else llm.generate(p, max_tokens=tokens)
            st = c.stats
            drafted, accepted, committed, cycles = drafted + st.drafted, accepted + st.accepted, committed + st.committed, cycles + st.cycles
        name = llm.drafter
    return dict(kv=kv, kv_drafter=kv_drafter, drafter=name, drafted=drafted, accepted=accepted,
                acceptance=accepted / drafted if drafted else 0.0, tau=committed / cycles if cycles else 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kinds", default="dflash,draft,dspark,eagle3,mtp,draft-tiny")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lf-kv-"))
    pairs = {"dflash": dict(pair="demo", label="demo: SmolLM2-135M Q4_1 + shipped DFlash", chat=True),
             "draft": dict(pair="demo-draft", label="demo-draft: SmolLM2-135M Q4_1 + its Q2_K (draft model)", chat=True)}
    pairs |= tiny_pairs(work)
    kinds = [k for k in args.kinds.split(",") if k]
    rows = []
    t0 = time.time()
    for kind in kinds:
        opts = dict(pairs[kind])
        chat = opts.pop("chat", False)
        prompts = chat_prompts(args.prompts) if chat else word_prompts(args.prompts)
        label = opts["label"]
        for kv in KVS:
            for kv_d in KVS:
                r = measure(opts, prompts, args.tokens, chat, kv, kv_d) | dict(kind=kind, pair=label)
                rows.append(r)
                print(f"{kind:<11} target {kv:<5} drafter {kv_d:<5} {r['drafter']:<8} acceptance {100 * r['acceptance']:5.1f}% "
                      f"({r['accepted']}/{r['drafted']})  τ {r['tau']:.2f}   [{time.time() - t0:.0f} s]", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(dict(prompts=args.prompts, tokens=args.tokens, rows=rows), indent=1))
    print()
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """Markdown: one line per pair and target KV, a column pair (acceptance, τ) per drafter KV."""
    head = "| pair | target KV | " + " | ".join(f"drafter {k}: acc / τ" for k in KVS) + " |"
    out = [head, "|" + "---|" * (2 + len(KVS))]
    seen = []
    for r in rows:
        key = (r["pair"], r["kv"])
        if key in seen:
            continue
        seen.append(key)
        cells = []
        for k in KVS:
            m = next((x for x in rows if (x["pair"], x["kv"], x["kv_drafter"]) == (*key, k)), None)
            cells.append(f"{100 * m['acceptance']:.1f}% / {m['tau']:.2f}" if m else "-")
        out.append(f"| {r['pair']} | {r['kv']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
