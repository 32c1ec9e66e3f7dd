#!/usr/bin/env python3
"""Is speculative greedy output byte-identical to plain greedy output? For every drafter, in exact mode and not.

For each pair (default: demo, demo-draft, qwen-coder) and each drafter it can run (dflash,
draft, ngram, and the +ngram combinations; adaptive draft length and a fixed one), every
prompt of the bench suite (benchmarks/speed/bench_suite.py: Spec-Bench's six categories, first
prompt each, and the first HumanEval prompt) is generated greedily at each length
(default 128 and 256 new tokens) and compared with plain decoding (``--spec none``) of the
same engine settings: token ids and detokenized text. Engines are built the way the CLI
builds them (``config.config_from`` + ``engine.open_engine``, one shared target).

``tiny-llama`` and ``tiny-qwen35`` are random-weight Q4_K_M targets built here (a 4-layer llama
and a Gated-DeltaNet hybrid with an MTP block, both 256 wide so that every matmul weight is a
K-quant), with a drafter of every kind for them: a draft model, DFlash, DFlash2, EAGLE-3 (an
echoing one, which is often right) and MTP (whose block mostly repeats the trunk's guess). Their
drafters are random, so apart from EAGLE-3, MTP and n-gram they are nearly always wrong: every
cycle cuts the cache back, which is the path exactness has to survive.

``--numerics exact`` is ``localflash run --exact``; ``--numerics default`` is llama.cpp's
default CPU numerics, where the script reports where the first changed token was and the
plain run's top-2 logit margin there (how close the tie was). Each numerics setting runs in
its own process (ggml reads its tiled-matmul switch once per process).

    .venv/bin/python benchmarks/conformance/check_exact.py                      # exact + default, all pairs, 2 threads
    .venv/bin/python benchmarks/conformance/check_exact.py --pairs qwen-coder --numerics exact --threads 1
    .venv/bin/python benchmarks/conformance/check_exact.py --pairs tiny-llama,tiny-qwen35 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# pair -> the --spec kinds to check besides plain
DRAFTERS = {
    "demo": ["dflash", "ngram", "dflash+ngram"],
    "demo-draft": ["draft", "draft+ngram"],
    "qwen-coder": ["draft", "ngram", "draft+ngram"],
    "tiny-llama": ["draft", "ngram", "dflash", "dflash2", "eagle3", "eagle3+ngram"],
    "tiny-qwen35": ["draft", "ngram", "dflash", "dflash2", "eagle3", "mtp", "mtp+ngram"],
}
SPEC_OF = {"dflash2": "dflash"}  # a DFlash2 file drafts through --spec dflash
FIXED_K = 4
TINY_DIR = Path(tempfile.gettempdir()) / "localflash-check-exact-tiny"


def tiny_pair(pair: str) -> tuple[Path, dict[str, Path]]:
    """The tiny target (Q4_K_M) and its drafter file per kind, written once into TINY_DIR."""
    from localflash.llama.quantize import quantize
    from localflash.formats.dflash_gguf import DFlash2Spec, DFlashSpec
    from localflash.testing.tiny import (Eagle3Spec, HybridSpec, TinySpec, write_dflash, write_dflash2, write_eagle3,
                                         write_hybrid, write_target)

    d = TINY_DIR / pair
    d.mkdir(parents=True, exist_ok=True)
    target = d / "target-q4km.gguf"
    if pair == "tiny-llama":
        layers = [1, 2, 3]
        if not target.exists():
            quantize(write_target(d / "target-f32.gguf", TinySpec(n_embd=256, n_layer=4, seed=3)), target, "Q4_K_M")
    else:
        layers = [1, 3, 5]
        spec = HybridSpec(seed=3, n_embd=256, n_ff=512, head_dim=64, n_rot=16, linear_head_dim=64, linear_v_heads=4,
                          n_nextn=1, mtp_agree=0.3)
        if not target.exists():
            quantize(write_hybrid(d / "target-f32.gguf", spec), target, "Q4_K_M")
    files = {
        "draft": (d / "draft.gguf", lambda p: write_target(p, TinySpec(n_layer=2, seed=1))),
        "dflash": (d / "dflash.gguf", lambda p: write_dflash(p, DFlashSpec(n_embd=256, target_layers=layers, block_size=8))),
        "dflash2": (d / "dflash2.gguf", lambda p: write_dflash2(p, DFlash2Spec(n_embd=256, target_layers=layers))),
        "eagle3": (d / "eagle3.gguf", lambda p: write_eagle3(p, Eagle3Spec(n_embd=256, target_hidden_size=256,
                                                                             target_layers=layers, echo=4.0, fc_scale=0.3))),
    }
    for path, write in files.values():
        if not path.exists():
            write(path)
    return target, {kind: path for kind, (path, _) in files.items()}


def modes_for(pair: str) -> list[tuple[str, str, int | None, bool]]:
    """(name, kind, draft_max, adaptive)"""
    out = [("plain", "none", None, False)]
    for kind in DRAFTERS[pair]:
        out.append((f"{kind}-adaptive", kind, None, True))
        if "+" not in kind:
            out.append((f"{kind}-k{FIXED_K}", kind, FIXED_K, False))
    return out


def run_pair(pair: str, exact: bool, threads: int, lengths: list[int], ctx: int) -> dict:
    import numpy as np

    from localflash.bench import rig as bl
    from localflash.bench.prompts import HUMANEVAL_COMPLETE_INSTRUCTION, humaneval, spec_bench_groups
    from localflash.llama import Model, ModelOptions
    from localflash.config import config_from
    from localflash.engine import open_engine
    from localflash.speculative.stats import Stats

    tiny = pair.startswith("tiny-")
    if tiny:
        target_file, drafter_files = tiny_pair(pair)

    def cfg_for(kind: str = "none", **kw):
        base_kind, _, lookup = kind.partition("+")
        spec = SPEC_OF.get(base_kind, base_kind) + ("+" + lookup if lookup else "")
        if not tiny:
            return config_from(pair, None, None, exact=exact, threads=threads, ctx=ctx, spec=spec, **kw)
        drafter = drafter_files.get(base_kind)
        return config_from(None, str(target_file), str(drafter) if drafter else None,
                           exact=exact, threads=threads, ctx=ctx, spec=spec, **kw)

    base = cfg_for()
    if exact:
        from localflash.engine import exact_options

        exact_options(True)  # the process-wide switch, before the first context
    mtp = any(kind.startswith("mtp") for kind in DRAFTERS[pair])
    target = Model(base.target, ModelOptions(use_extra_bufts=not exact, load_mtp=mtp, n_gpu_layers=0 if exact else -1))
    prompts = spec_bench_groups(1) + humaneval(1, HUMANEVAL_COMPLETE_INSTRUCTION)
    tokenized = [bl.render(target, p.text)[1] for p in prompts]
    engines = {}
    for name, kind, k, adaptive in modes_for(pair):
        engines[name] = open_engine(cfg_for(kind, draft_max=k, adaptive=adaptive), target=target)
    margins: list[float] = []
    plain_ctx = engines["plain"].ctx
    inner_logits = plain_ctx.logits

    def logits_recording(row=-1):  # the plain run's top-2 margin at every sampled position
        x = inner_logits(row)
        top = np.partition(x, -2)[-2:]
        margins.append(float(abs(top[1] - top[0])))
        return x

    plain_ctx.logits = logits_recording
    results = []
    for n in lengths:
        for p, toks in zip(prompts, tokenized):
            outs = {}
            for name, eng in engines.items():
                eng.reset()
                if name == "plain":
                    margins.clear()
                got: list[int] = []
                st = Stats()
                t = time.perf_counter()
                for new in eng.generate(toks, n, None, st):
                    got += new
                outs[name] = (got, time.perf_counter() - t, st)
            plain, plain_margins = outs["plain"][0], list(margins)
            for name, (got, secs, st) in outs.items():
                if name == "plain":
                    continue
                row = {"pair": pair, "exact": exact, "threads": threads, "max_tokens": n, "mode": name, "prompt": p.id,
                       "category": p.category, "prompt_tokens": len(toks), "tokens": len(got), "plain_tokens": len(plain),
                       "same_ids": got == plain, "same_text": target.detokenize(got) == target.detokenize(plain), "seconds": secs,
                       "drafted": st.drafted, "accepted": st.accepted}
                if got != plain:
                    i = next((j for j, (a, b) in enumerate(zip(got, plain)) if a != b), min(len(got), len(plain)))
                    row.update(first_diff=i, plain_margin_there=plain_margins[i] if i < len(plain_margins) else None,
                               plain_min_margin=min(plain_margins) if plain_margins else None)
                results.append(row)
            print(f"{pair} {'exact' if exact else 'default'} t{threads} n{n} {p.id}: "
                  + ", ".join(f"{r['mode']} {'=' if r['same_ids'] else '≠@' + str(r['first_diff'])}" for r in results[-(len(outs) - 1):]),
                  file=sys.stderr, flush=True)
    for e in engines.values():
        e.close()
    return {"rows": results}


def summarize(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["pair"], "exact" if r["exact"] else "default", r["threads"], r["mode"], r["max_tokens"]), []).append(r)
    lines = ["| pair | numerics | threads | mode | new tokens | drafts accepted | same as plain (ids and text) | first changed token: prompt @ index (plain top-2 margin there) |",
             "|---|---|---|---|---|---|---|---|"]
    for (pair, num, t, mode, n), rs in groups.items():
        same = sum(r["same_ids"] and r["same_text"] for r in rs)
        diffs = "; ".join(f"{r['prompt']} @ {r['first_diff']} ({r['plain_margin_there']:.3g})" if r.get("plain_margin_there") is not None
                          else f"{r['prompt']} @ {r['first_diff']}" for r in rs if not r["same_ids"])
        drafted, accepted = sum(r.get("drafted", 0) for r in rs), sum(r.get("accepted", 0) for r in rs)
        lines.append(f"| {pair} | {num} | {t} | {mode} | {n} | {accepted}/{drafted} | {same}/{len(rs)} | {diffs or '—'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="demo,demo-draft,qwen-coder")
    ap.add_argument("--numerics", default="exact,default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="128,256")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.one:
        pair, num = a.one.split(":")
        print(json.dumps(run_pair(pair, num == "exact", a.threads, lengths, a.ctx)))
        return 0
    rows: list[dict] = []
    failed = False
    for pair in a.pairs.split(","):
        if pair.startswith("tiny-"):
            tiny_pair(pair)  # written once, before the runs read them
    for num in a.numerics.split(","):
        for pair in a.pairs.split(","):
            cmd = [sys.executable, __file__, "--threads", str(a.threads), "--lengths", a.lengths, "--ctx", str(a.ctx), "--one", f"{pair}:{num}"]
            res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
            if res.returncode:
                print(f"{pair} {num}: failed (exit {res.returncode})", file=sys.stderr)
                failed = True
                continue
            got = json.loads(res.stdout.strip().splitlines()[-1])["rows"]
            rows += got
            if num == "exact" and not all(r["same_ids"] and r["same_text"] for r in got):
                failed = True
    print(summarize(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    exact_rows = [r for r in rows if r["exact"]]
    if exact_rows:
        same = sum(r["same_ids"] and r["same_text"] for r in exact_rows)
        print(f"\nexact mode: {same}/{len(exact_rows)} speculative runs byte-identical to plain")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
