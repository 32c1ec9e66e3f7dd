#!/usr/bin/env python3
"""Is the C++ peer's llama_decode faster than ours on the same model and batch, loop aside?

The suite compares whole runs (localflash's loop vs ``llama-speculative-simple``); when the
peer wins at the same draft length, the cause is either the loop (drafts, host time, cycle
count) or the decode itself. This script takes the loop out: it times one target decode of
``n`` rows (n = 1: a plain decode step; n = k+1: a verify step) through localflash's bindings
and through the peer's own build of the same llama.cpp (``llama-bench`` from scripts/build_peer.sh:
``-p n`` for a batch of n, ``-n N`` for N one-token steps), same file, threads, flash-attention
setting and OMP wait policy. The two take turns, round by round, so the drift of a shared
machine hits both; the figure is the ratio of the medians (peer tokens/s ÷ ours).

    .venv/bin/python benchmarks/speed/peer_parity.py --pair qwen-coder --rounds 5
    PEER_DIR=/work/peer .venv/bin/python benchmarks/speed/peer_parity.py --pair demo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def ours(path: str, threads: int, batch: int, steps: int, reps: int) -> dict:
    """tokens/s of one decode of ``batch`` rows at position 0 (median of reps) and of ``steps`` one-token decodes."""
    from localflash.llama import Context, ContextOptions, Model

    m = Model(path)
    ctx = Context(m, ContextOptions(n_ctx=512, n_threads=threads, n_outputs_max=batch))
    toks = [m.bos if m.bos >= 0 else 1] + [100 + i for i in range(max(batch, steps))]
    pp = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        ctx.decode(toks[:batch], 0, "all")
        ctx.logits(0)
        pp.append(time.perf_counter() - t)
        ctx.seq_rm(0)
    t = time.perf_counter()
    for i in range(steps):  # llama-bench's tg: one token at a time from an empty cache
        ctx.decode([toks[i]], i, "last")
        ctx.logits(-1)
    tg = time.perf_counter() - t
    return {"pp_ts": batch / statistics.median(pp[1:]), "tg_ts": steps / tg}


def peer(bench: Path, path: str, threads: int, batch: int, steps: int, reps: int) -> dict:
    out = {}
    for key, args in (("pp_ts", ["-p", str(batch), "-n", "0", "-r", str(reps)]), ("tg_ts", ["-p", "0", "-n", str(steps), "-r", "1"])):
        res = subprocess.run([str(bench), "-m", path, "-t", str(threads), "-o", "json", *args], capture_output=True, text=True, check=True)
        out[key] = float(json.loads(res.stdout)[0]["avg_ts"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="qwen-coder")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=5, help="rows of the timed batch (a verify of k = batch-1 drafts)")
    ap.add_argument("--steps", type=int, default=32, help="one-token decodes timed")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from localflash.config import config_from

    path = str(config_from(a.pair, None, None).target)
    if a.one:
        print(json.dumps(ours(path, a.threads, a.batch, a.steps, a.reps)))
        return 0
    bench = Path(os.environ.get("PEER_DIR", Path(__file__).resolve().parents[2] / "peer")) / "bin" / "llama-bench"
    if not bench.exists():
        print(f"error: no {bench} (scripts/build_peer.sh builds it; PEER_DIR names another folder)", file=sys.stderr)
        return 1
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    got: dict[str, list[dict]] = {"ours": [], "peer": []}
    for r in range(a.rounds):
        order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
        for who in order:
            if who == "ours":
                res = subprocess.run([sys.executable, __file__, "--pair", a.pair, "--threads", str(a.threads), "--batch", str(a.batch),
                                      "--steps", str(a.steps), "--reps", str(a.reps), "--one"], capture_output=True, text=True, env=env, check=True)
                got["ours"].append(json.loads(res.stdout.strip().splitlines()[-1]))
            else:
                os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
                got["peer"].append(peer(bench, path, a.threads, a.batch, a.steps, a.reps))
            print(f"round {r + 1} {who}: " + ", ".join(f"{k} {v:.2f}" for k, v in got[who][-1].items()), file=sys.stderr, flush=True)
    med = {who: {k: statistics.median(x[k] for x in rows) for k in ("pp_ts", "tg_ts")} for who, rows in got.items()}
    ratio = {k: med["peer"][k] / med["ours"][k] for k in ("pp_ts", "tg_ts")}
    print(f"{Path(path).name}, {a.threads} thread(s), {a.rounds} interleaved rounds (medians):")
    print(f"  batch of {a.batch} rows: ours {med['ours']['pp_ts']:.2f} tok/s, peer {med['peer']['pp_ts']:.2f} tok/s, peer/ours {ratio['pp_ts']:.3f}")
    print(f"  one-token steps:  ours {med['ours']['tg_ts']:.2f} tok/s, peer {med['peer']['tg_ts']:.2f} tok/s, peer/ours {ratio['tg_ts']:.3f}")
    print(json.dumps({"median": med, "peer_over_ours": ratio, "rounds": got}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
