#!/usr/bin/env python3
"""MTP drafting against the C++ peer: same greedy text, same drafts offered and accepted, cycle by cycle.

For each prompt it runs ``localflash run --spec mtp --fixed --draft-max K`` (1 thread, greedy, raw) and
llama.cpp's ``llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max K`` on the same tiny
qwen35 + nextn model, then compares the text and the drafted/accepted counts.

The two loops start a cycle apart: localflash prefills the whole prompt and takes the first token from
the prefill logits, the peer prefills all but the last prompt token and drafts from there. So the peer
gets the prompt *plus localflash's first token* (kept only where that text tokenizes to exactly those
ids) and ``-n N-1``: its cycles then draft from the same token at the same position as ours.
The per-cycle (drafted, accepted) pairs come from the peer's debug log (``-v``: "accepted a/b draft
tokens") and from the same localflash run repeated in-process with its cycles recorded.

    .venv/bin/python benchmarks/conformance/peer_mtp_conformance.py                      # tiny model written to a temp dir
    PEER_DIR=/work/peer .venv/bin/python benchmarks/conformance/peer_mtp_conformance.py --draft-max 3 --tokens 96
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = [
    "Once upon a time there was a little",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "a garden of quiet stone light and paper over nine silver hills where we",
    "Write a short poem about the sea and the sky.",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "the river the river the river the river",
    "In 1492 Columbus sailed the ocean blue. In 1620 the",
    "Paper, stone and light: the three things the garden keeps.",
    "Question: what is the capital of France? Answer:",
    "over nine silver hills where we walked, over nine silver hills where",
    "Translate to French: the house is red.",
]
CYCLE = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def ours_cli(model: Path, prompt: str, k: int, n: int, ctx: int) -> tuple[str, dict]:
    cmd = [sys.executable, "-m", "localflash.cli", "run", "-m", str(model), "--spec", "mtp", "--fixed", "--draft-max", str(k),
           "-n", str(n), "-t", "1", "--raw", "-c", str(ctx), "--json", prompt]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return r.stdout.rstrip("\n"), json.loads(r.stderr.strip().splitlines()[-1])


def ours_cycles(engine, tokens: list[int], n: int) -> tuple[list[int], list[tuple[int, int]]]:
    from localflash.speculative.stats import Stats

    st = Stats()
    cycles: list[tuple[int, int]] = []
    record = st.record_cycle

    def logged(n_drafted, n_accepted, n_committed):
        cycles.append((n_drafted, n_accepted))
        record(n_drafted, n_accepted, n_committed)

    st.record_cycle = logged
    engine.reset()
    out = [t for chunk in engine.generate(tokens, n, None, st) for t in chunk]
    return out, cycles


def peer(peer_bin: Path, model: Path, prompt: str, k: int, n: int, ctx: int) -> tuple[bytes, dict, list[tuple[int, int]]]:
    cmd = [str(peer_bin), "-m", str(model), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k), "--spec-draft-p-min", "0",
           "-p", prompt, "-n", str(n), "-t", "1", "-tb", "1", "-td", "1", "--temp", "0", "--top-k", "1", "-c", str(ctx), "-v"]
    r = subprocess.run(cmd, capture_output=True, timeout=600)  # bytes: the peer prints pieces of UTF-8 characters
    log = (r.stdout + r.stderr).decode("utf-8", errors="replace")
    if r.returncode:
        raise RuntimeError(f"peer failed ({r.returncode}): {log[-2000:]}")
    counts = {key: int(v) for key, v in re.findall(r"\b(n_drafted|n_accept|n_predict)\s+=\s+(\d+)", log)}
    cycles = [(int(b), int(a)) for a, b in CYCLE.findall(log)]
    return r.stdout, counts, cycles


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a qwen35 GGUF with a nextn block (default: the tiny test model, written now)")
    ap.add_argument("--draft-max", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--json", help="write the per-prompt results here")
    args = ap.parse_args(argv)
    peer_bin = Path(os.environ.get("PEER_DIR", "/work/peer")) / "bin" / "llama-speculative-simple"
    if not peer_bin.exists():
        print(f"error: {peer_bin} not found (build it with scripts/build_peer.sh, or set PEER_DIR)", file=sys.stderr)
        return 1

    from localflash.llama import Model, ModelOptions
    from localflash.config import config_from
    from localflash.engine import open_engine
    from localflash.testing.tiny import HybridSpec, write_hybrid

    tmp = Path(tempfile.mkdtemp(prefix="mtp-peer-"))
    model = Path(args.model) if args.model else write_hybrid(tmp / "qwen35-mtp-agree.gguf", HybridSpec(seed=3, n_nextn=1, mtp_agree=0.3))
    cfg = config_from(None, str(model), None, spec="mtp", draft_max=args.draft_max, ctx=args.ctx, threads=1, adaptive=False)
    engine = open_engine(cfg)
    vocab = Model(model, ModelOptions(vocab_only=True))
    rows, n_same_text, n_same_cycles = [], 0, 0
    k, n = args.draft_max, args.tokens
    print(f"model {model.name}, draft-max {k}, {n} tokens, 1 thread, greedy; peer {peer_bin}")
    for prompt in PROMPTS:
        tokens = vocab.tokenize(prompt, add_special=True, parse_special=False)
        text, stats = ours_cli(model, prompt, k, n, args.ctx)
        out, cycles = ours_cycles(engine, tokens, n)
        assert vocab.detokenize(out) == text, "the CLI and the in-process run disagree"
        first = vocab.detokenize(out[:1])
        aligned = prompt + first
        if vocab.tokenize(aligned, add_special=True, parse_special=True) != tokens + out[:1]:
            rows.append({"prompt": prompt, "skipped": "prompt + first token does not re-tokenize to the same ids"})
            print(f"  skip {prompt[:40]!r}: prompt + first token re-tokenizes differently")
            continue
        p_out, p_counts, p_cycles = peer(peer_bin, model, aligned, k, n - 1, args.ctx)
        ours_bytes = b"".join(vocab.piece(t) for t in out)
        p_text = p_out.split(aligned.encode(), 1)[-1]
        same_text = (vocab.piece(out[0]) + p_text).startswith(ours_bytes)
        # localflash's last cycle may be a plain one (one token left); the peer drafts k there (n_max 0 = no cap)
        m = len(cycles) - (1 if cycles and cycles[-1][0] == 0 else 0)
        same_cycles = p_cycles[:m] == cycles[:m]
        ours_d = sum(d for d, _ in cycles[:m])
        ours_a = sum(a for _, a in cycles[:m])
        peer_d = sum(d for d, _ in p_cycles[:m])
        peer_a = sum(a for _, a in p_cycles[:m])
        n_same_text += same_text
        n_same_cycles += same_cycles
        rows.append({"prompt": prompt, "same_text": same_text, "same_cycles": same_cycles, "cycles": m,
                     "ours": {"drafted": stats["drafted"], "accepted": stats["accepted"], "first_m_cycles": [ours_d, ours_a]},
                     "peer": {**p_counts, "first_m_cycles": [peer_d, peer_a], "cycles_total": len(p_cycles)}})
        print(f"  {'same' if same_text else 'DIFF'} text, {'same' if same_cycles else 'DIFF'} cycles ({m}): "
              f"ours drafted/accepted {ours_d}/{ours_a} (run total {stats['drafted']}/{stats['accepted']}), "
              f"peer {peer_d}/{peer_a} (run total {p_counts.get('n_drafted')}/{p_counts.get('n_accept')}, "
              f"{p_counts.get('n_predict')} predicted)  {prompt[:40]!r}")
        if not same_cycles:
            i = next(j for j, (a, b) in enumerate(zip(cycles, p_cycles)) if a != b) if any(
                a != b for a, b in zip(cycles, p_cycles)) else min(len(cycles), len(p_cycles))
            print(f"    first different cycle {i}: ours {cycles[i:i + 3]} peer {p_cycles[i:i + 3]}")
    compared = sum(1 for r in rows if "skipped" not in r)
    print(f"{compared} prompts compared: same text {n_same_text}/{compared}, same per-cycle drafted/accepted {n_same_cycles}/{compared}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    engine.close()
    return 0 if n_same_text == compared == n_same_cycles else 1


if __name__ == "__main__":
    sys.exit(main())
