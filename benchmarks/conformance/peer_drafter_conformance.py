#!/usr/bin/env python3
"""Conformance of localflash's DFlash2, DSpark and EAGLE-3 drafters with llama.cpp's own driver.

On the same tiny target + drafter files, greedy and at a fixed draft length,
``llama-speculative-simple`` (``--spec-type draft-dflash`` / ``draft-dspark`` / ``draft-eagle3``,
built by ``scripts/build_peer.sh``) and localflash's Engine are run cycle by
cycle and compared: drafted and accepted counts per cycle, the target's token
after each cycle, and (EAGLE-3 and DSpark, whose drivers log each position's top
candidate) the draft tokens themselves. DSpark runs at n_max = its block (the
anchor-first layout drafts all of it), with and without the confidence cut.

Alignment: llama.cpp prefills all prompt tokens but the last and drafts from
that one; localflash prefills the whole prompt, samples the first token t1 and
drafts from t1. So the peer is handed the prompt text of ``prompt + [t1]``
(only prompts whose text tokenizes back to exactly those ids are used): both
then run their first cycle at the same position with the same newest token.

    PEER_DIR=/work/peer .venv/bin/python benchmarks/conformance/peer_drafter_conformance.py [--prompts 12] [--tokens 96] [--only dspark]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localflash.llama import Context, ContextOptions, Model
from localflash.engine import make_drafter
from localflash.speculative.loop import Engine
from localflash.formats.dflash_gguf import DFlash2Spec, DSparkSpec
from localflash.testing.tiny import Eagle3Spec, TinySpec, write_dflash2, write_dspark, write_eagle3, write_target

WORDS = "the river a garden of quiet stone light and paper over nine silver hills where we".split()
N_CTX = 1024
ACCEPT = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")
CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)")


@dataclass
class Cycle:
    drafted: int
    accepted: int
    last: int  # the target's newest token after the cycle
    draft: list[int] = field(default_factory=list)  # empty where the driver does not log it


def localflash_cycles(target: Model, make, prompt: list[int], n_tokens: int) -> tuple[list[int], list[Cycle]]:
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1))
    drafter = make(ctx)
    cycles: list[Cycle] = []
    pending: list[list[int]] = []
    prefilled = []
    propose, on_decode, on_prompt = drafter.propose, drafter.on_target_decode, drafter.on_prompt

    def rec_propose(history, n_past, k):
        d = propose(history, n_past, k)
        pending.append(d)
        return d

    def rec_decode(tctx, start_pos, n_committed):
        on_decode(tctx, start_pos, n_committed)
        if prefilled:  # every target decode after the prefill is one cycle
            d = pending.pop() if pending else []
            cycles.append(Cycle(len(d), n_committed - 1, -1, list(d)))

    def rec_prompt(prompt):
        on_prompt(prompt)
        prefilled.append(True)

    drafter.propose, drafter.on_target_decode, drafter.on_prompt = rec_propose, rec_decode, rec_prompt
    engine = Engine(target, ctx, drafter, adaptive=False)
    out: list[int] = []
    n_cycle = 0
    for chunk in engine.generate(prompt, n_tokens):
        out += chunk
        if len(out) > 1 or len(chunk) > 1:
            # each chunk after the first ends with the cycle's newest token (the bonus)
            if n_cycle < len(cycles):
                cycles[n_cycle].last = chunk[-1]
                n_cycle += 1
    engine.close()
    return out, cycles


def peer_cycles(peer: Path, target: Path, drafter: Path, spec_type: str, text: str, n_predict: int, n_max: int, p_min: float) -> list[Cycle]:
    cmd = [str(peer), "-m", str(target), "-md", str(drafter), "--spec-type", spec_type,
           "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", str(p_min),
           "-p", text, "-n", str(n_predict), "--temp", "0", "-t", "1", "-td", "1", "-c", str(N_CTX), "-v"]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    err = r.stderr.decode("utf-8", errors="replace")
    if r.returncode != 0:
        sys.exit(f"peer failed ({r.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    cycles: list[Cycle] = []
    steps: list[int] = []
    for line in err.splitlines():
        m = CANDIDATE.search(line)
        if m:
            pos, tok = int(m[1]), int(m[2])
            if pos == 0:
                steps = []
            steps.append(tok)
            continue
        m = ACCEPT.search(line)
        if m:
            drafted = int(m[2])
            logged = spec_type in ("draft-eagle3", "draft-dspark")
            cycles.append(Cycle(drafted, int(m[1]), int(m[3]), steps[:drafted] if logged else []))
            steps = []
    return cycles


def aligned_prompts(target: Model, n: int, first_token) -> list[tuple[list[int], str]]:
    """Prompts whose text with the first generated token appended tokenizes back exactly."""
    rng = np.random.default_rng(7)
    out = []
    while len(out) < n:
        words = list(rng.choice(WORDS, size=int(rng.integers(4, 12))))
        ids = target.tokenize(" ".join(words))
        t1 = first_token(ids)
        text = target.detokenize(ids[1:] + [t1]).lstrip(" ")
        if target.tokenize(text) == ids + [t1]:
            out.append((ids, text))
    return out


def compare(label: str, ours: list[Cycle], theirs: list[Cycle]) -> tuple[int, int, str]:
    """(cycles compared, identical cycles, first difference).

    The last cycle is left out when localflash had no token budget left for a draft (it decodes
    one plain step) while the peer drafted: llama.cpp's ``common_speculative_draft`` reads a
    per-call ``n_max`` of 0 as "no limit", so its last cycle drafts a full block past ``-n``.
    """
    n = min(len(ours), len(theirs))
    if n and n == len(ours) and ours[n - 1].drafted == 0 and theirs[n - 1].drafted > 0:
        n -= 1
    same = 0
    first = ""
    for i in range(n):
        a, b = ours[i], theirs[i]
        ok = (a.drafted, a.accepted, a.last) == (b.drafted, b.accepted, b.last) and (not b.draft or a.draft == b.draft)
        if ok:
            same += 1
        elif not first:
            first = f"cycle {i}: localflash {a.accepted}/{a.drafted} -> {a.last} {a.draft or ''}; peer {b.accepted}/{b.drafted} -> {b.last} {b.draft or ''}"
    return n, same, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--peer-dir", default=os.environ.get("PEER_DIR", "/work/peer"))
    ap.add_argument("--only", default="", help="run only the drafters whose label starts with this (e.g. dspark)")
    args = ap.parse_args()
    peer = Path(args.peer_dir) / "bin" / "llama-speculative-simple"
    if not peer.exists():
        sys.exit(f"error: {peer} not found (build it with scripts/build_peer.sh)")
    work = Path(tempfile.mkdtemp(prefix="lf-peer-"))
    target_path = write_target(work / "target.gguf", TinySpec(n_layer=4, seed=0))
    target = Model(target_path)
    drafters = [
        # (label, file, spec type, draft length, p_min)
        ("dflash2 b8 top-4", write_dflash2(work / "dflash2.gguf", DFlash2Spec(target_layers=[1, 2, 3])), "draft-dflash", 7, 0.0),
        ("dflash2 b8 top-4 p_min 0.4", work / "dflash2.gguf", "draft-dflash", 7, 0.4),
        ("dflash2 b4 top-3", write_dflash2(work / "dflash2-b4.gguf", DFlash2Spec(target_layers=[0, 3], block_size=4, selector_top_k=3, seed=4)), "draft-dflash", 3, 0.0),
        ("eagle3 echo", write_eagle3(work / "eagle3-echo.gguf", Eagle3Spec(echo=4.0, fc_scale=0.3)), "draft-eagle3", 4, 0.0),
        ("eagle3 echo p_min 0.3", work / "eagle3-echo.gguf", "draft-eagle3", 4, 0.3),
        ("eagle3 random", write_eagle3(work / "eagle3.gguf", Eagle3Spec(target_layers=[0, 1, 3])), "draft-eagle3", 6, 0.0),
        ("eagle3 d2t own head", write_eagle3(work / "eagle3-d2t.gguf", Eagle3Spec(draft_vocab=8000, own_embeddings=True, seed=5)), "draft-eagle3", 4, 0.0),
        # DSpark: random heads; the Markov head set to the target's bigram (often right); the bonus-anchor layout
        ("dspark b8", write_dspark(work / "dspark.gguf", DSparkSpec(target_layers=[1, 2, 3])), "draft-dspark", 8, 0.0),
        ("dspark b8 p_min 0.5", work / "dspark.gguf", "draft-dspark", 8, 0.5),
        ("dspark b8 agree", write_dspark(work / "dspark-agree.gguf", DSparkSpec(target_layers=[1, 2, 3], seed=6), agree_with=target_path),
         "draft-dspark", 8, 0.0),
        ("dspark b8 agree p_min 0.5", work / "dspark-agree.gguf", "draft-dspark", 8, 0.5),
        ("dspark b6 bonus anchor p_min 0.4", write_dspark(work / "dspark-bonus.gguf", DSparkSpec(target_layers=[0, 3], block_size=6, sample_from_anchor=False, conf_bias=1.0, seed=8)),
         "draft-dspark", 5, 0.4),
    ]
    drafters = [d for d in drafters if d[0].startswith(args.only)]

    def plain_first(ids):
        ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_threads=1))
        ctx.decode(ids, 0, "last")
        t1 = int(np.argmax(ctx.logits(-1)))
        ctx.close()
        return t1

    cases = aligned_prompts(target, args.prompts, plain_first)
    print(f"peer: {peer}\ntarget: tiny llama 4x64 (seed 0); {len(cases)} prompts x {args.tokens} tokens, greedy, fixed draft length, 1 thread")
    print("(each prompt's last cycle, where localflash has no budget left to draft and llama.cpp drafts past -n, is left out)")
    print(f"{'drafter':<28} {'cycles':>7} {'identical':>10} {'drafted lf/peer':>16} {'accepted lf/peer':>17}")
    all_ok = True
    for label, path, spec_type, n_max, p_min in drafters:
        tot = [0, 0, 0, 0, 0, 0]
        firsts = []
        for ids, text in cases:
            if spec_type in ("draft-dflash", "draft-dspark"):
                make = lambda ctx, p=path, pm=p_min: make_drafter("dflash", target, ctx, Model(p), n_ctx=N_CTX, threads=1, p_min=pm)  # noqa: E731
            else:
                make = lambda ctx, p=path, pm=p_min, k=n_max: make_drafter("eagle3", target, ctx, Model(p), n_ctx=N_CTX, max_draft=k, threads=1, p_min=pm)  # noqa: E731
            _, ours = localflash_cycles(target, make, ids, args.tokens)
            theirs = peer_cycles(peer, target_path, path, spec_type, text, args.tokens - 1, n_max, p_min)
            n, same, first = compare(label, ours, theirs)
            tot[0] += n
            tot[1] += same
            tot[2] += sum(c.drafted for c in ours[:n])
            tot[3] += sum(c.drafted for c in theirs[:n])
            tot[4] += sum(c.accepted for c in ours[:n])
            tot[5] += sum(c.accepted for c in theirs[:n])
            if first:
                firsts.append(f"  prompt {ids[:6]}...: {first}")
        all_ok &= tot[0] == tot[1]
        print(f"{label:<28} {tot[0]:>7} {tot[1]:>10} {tot[2]:>7}/{tot[3]:<8} {tot[4]:>8}/{tot[5]:<8}")
        for line in firsts[:3]:
            print(line)
    print("all cycles identical" if all_ok else "differences listed above")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
