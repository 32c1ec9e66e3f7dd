#!/usr/bin/env python3
"""Synthetic acceptance, ours beside llama.cpp's: decode tok/s at per-token acceptance α × draft length.

BENCHMARK ONLY. Both sides run the demo pair (SmolLM2-135M + the shipped
DFlash drafter, which both really run every cycle) on the same chat prompts at
one thread, and both replace whether a draft token is accepted by a coin with
probability α per position:

- ours: ``SyntheticDrafter(α, k, inner=DFlashDrafter)`` proposes plain
  decoding's own continuation (each token right with probability α) and the
  target verifies as usual, so the output still equals plain decoding;
- the peer: ``llama-cli --spec-type draft-dflash --spec-synth-rates α,α²,…,α^k``
  (llama-speculative-simple has no synthetic option in this llama.cpp; llama-cli
  and llama-server have), which force-accepts drafted tokens (its output is not
  valid text).

Expected τ = 1 + α + … + α^k on both. Speedups are against each side's own
plain decoding (``--spec-type none`` for the peer). Draft length 15 stands for
16: a block-16 DFlash drafter proposes at most 15 tokens.
``ours-oracle`` is the free oracle alone (``bench --modes synthetic``): the loop's ceiling.

    .venv/bin/python benchmarks/speed/bench_synthetic.py --json synth.json
    PEER_DIR=/work/peer .venv/bin/python benchmarks/speed/bench_synthetic.py --alphas 0.8 --lengths 8 --prompts 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from localflash.bench import rig as bl  # noqa: E402

TEXTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle stays upright, in simple words.",
]
EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def peer_tok_s(binary: Path, target: Path, drafter: Path, text: str, n: int, k: int, alpha: float | None) -> float:
    args = [str(binary), "-m", str(target), "-p", text, "-n", str(n), "-st", "-t", "1", "-td", "1", "--temp", "0",
            "-c", "2048", "-lv", "4"]
    if alpha is None:
        args += ["--spec-type", "none"]
    else:
        rates = ",".join(f"{alpha ** (j + 1):.6g}" for j in range(k))
        args += ["--spec-type", "draft-dflash", "-md", str(drafter), "--spec-draft-n-max", str(k), "--spec-synth-rates", rates]
    out = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    found = EVAL.findall(out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"no eval time in the peer's log: {(out.stderr or out.stdout)[-500:]}")
    ms, tokens = found[-1]
    return int(tokens) / (float(ms) / 1000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alphas", default="0.6,0.8,0.95")
    ap.add_argument("--lengths", default="4,8,15")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    bl.set_omp_wait("passive")
    from localflash.llama import Context, ContextOptions, Model
    from localflash.registry.pairs import get_pair
    from localflash.engine import make_drafter
    from localflash.speculative.loop import Engine
    from localflash.speculative.stats import Stats

    peer = Path(os.environ.get("PEER_DIR", "/work/peer")) / "bin" / "llama-cli"
    pair = get_pair("demo")
    target = Model(pair.target)
    texts = TEXTS[: a.prompts]
    prompts = [bl.render(target, t)[1] for t in texts]
    alphas = [float(x) for x in a.alphas.split(",")]
    lengths = [int(x) for x in a.lengths.split(",")]

    def ours(k: int, alpha: float | None, inner: bool) -> tuple[float, float]:
        """Decode tok/s (tokens after the first over decode seconds) and τ, summed over the prompts."""
        gen = secs = committed = cycles = 0.0
        for toks, ref in zip(prompts, refs):
            ctx = Context(target, ContextOptions(n_ctx=2048, n_outputs_max=16, n_threads=1))
            drafter = None
            if alpha is not None:
                dflash = make_drafter("dflash", target, ctx, Model(pair.drafter), n_ctx=2048, threads=1) if inner else None
                drafter = make_drafter(f"synthetic@{alpha!r}", target, ctx, max_draft=k, n_ctx=2048, inner=dflash)
                drafter.set_reference(toks + ref)
            eng = Engine(target, ctx, drafter, adaptive=False, draft_max=k if alpha is not None else 0)
            st = Stats()
            out = [t for c in eng.generate(toks, a.tokens, None, st) for t in c]
            assert out == ref, "synthetic run left plain decoding"
            eng.close()
            gen, secs = gen + st.generated - 1, secs + st.t_decode
            committed, cycles = committed + st.committed, cycles + st.cycles
        return gen / secs, committed / cycles

    refs = []
    for toks in prompts:
        ctx = Context(target, ContextOptions(n_ctx=2048, n_threads=1))
        refs.append([t for c in Engine(target, ctx).generate(toks, a.tokens) for t in c])
        ctx.close()
    ours_plain = ours(0, None, False)[0]
    peer_plain = sum(peer_tok_s(peer, pair.target, pair.drafter, t, a.tokens, 0, None) for t in texts) / len(texts)
    print(f"plain: ours {ours_plain:.1f} tok/s, peer {peer_plain:.1f} tok/s")
    rows = []
    print(f"{'alpha':>5s} {'k':>3s} {'tau exp':>7s} {'ours tau':>8s} {'ours tok/s':>10s} {'x plain':>7s} {'peer tok/s':>10s} {'x plain':>7s} "
          f"{'oracle tok/s':>12s} {'x plain':>7s}")
    for alpha in alphas:
        if alpha != alphas[0]:  # plain again beside each α's rows: this machine's speed drifts
            ours_plain = ours(0, None, False)[0]
            peer_plain = sum(peer_tok_s(peer, pair.target, pair.drafter, t, a.tokens, 0, None) for t in texts) / len(texts)
            print(f"plain: ours {ours_plain:.1f} tok/s, peer {peer_plain:.1f} tok/s")
        for k in lengths:
            tau_exp = 1 + sum(alpha ** (j + 1) for j in range(k))
            o_tps, o_tau = ours(k, alpha, True)
            c_tps, _ = ours(k, alpha, False)
            p_tps = sum(peer_tok_s(peer, pair.target, pair.drafter, t, a.tokens, k, alpha) for t in texts) / len(texts)
            row = dict(alpha=alpha, k=k, tau_expected=tau_exp, ours_plain_tok_s=ours_plain, peer_plain_tok_s=peer_plain, ours_tau=o_tau, ours_tok_s=o_tps, ours_speedup=o_tps / ours_plain,
                       peer_tok_s=p_tps, peer_speedup=p_tps / peer_plain, oracle_tok_s=c_tps, oracle_speedup=c_tps / ours_plain)
            rows.append(row)
            print(f"{alpha:5.2f} {k:3d} {tau_exp:7.2f} {o_tau:8.2f} {o_tps:10.1f} {row['ours_speedup']:7.2f} {p_tps:10.1f} "
                  f"{row['peer_speedup']:7.2f} {c_tps:12.1f} {row['oracle_speedup']:7.2f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": bl.machine_info(), "plain": {"ours": ours_plain, "peer": peer_plain},
                                            "tokens": a.tokens, "prompts": texts, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
