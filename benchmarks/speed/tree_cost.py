"""The cost side of tree verification on this machine: one target pass of r rows as a chain and as a tree.

For each row count r, times a chain decode of r tokens and a tree decode of r nodes (the tree a
DDTree expansion of a fixed made-up distribution gives: a main chain and side branches, up to 16
leaves) at the same position, best of ``--repeat``, cutting back after each. Prints load
averages: on a shared machine these are not timing claims (docs/benchmarks.md turns them, and
a flat GPU verify cost, into a model of the gain).

    python benchmarks/speed/tree_cost.py --pair demo --rows 1,2,4,8,9,12,16,24,32
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from localflash.config import config_from_options
from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.tree import MAX_LEAVES, best_first, decode_tree, keep_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--rows", default="1,2,4,8,9,12,16,24,32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--prefix", type=int, default=256, help="committed tokens before the verified rows")
    a = ap.parse_args()
    cfg = config_from_options(pair=a.pair, threads=a.threads)
    model = Model(cfg.target)
    rows = [int(r) for r in a.rows.split(",")]
    ctx = Context(model, ContextOptions(n_ctx=2048, n_batch=512, n_ubatch=512, n_outputs_max=max(max(rows), MAX_LEAVES),
                                        n_threads=a.threads, n_seq_max=MAX_LEAVES))
    rng = np.random.default_rng(0)
    prefix = rng.integers(100, model.n_vocab - 100, size=a.prefix).tolist()
    ctx.decode(prefix[:-1], 0, "none")
    n_past = len(prefix) - 1
    logp = np.log(np.array([0.55, 0.25, 0.12, 0.08]))
    ids = np.array([11, 12, 13, 14])
    print(f"{cfg.target.name}, {a.threads} thread(s), {a.prefix} tokens committed; load average "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print("| rows | chain pass ms | tree pass ms | tree leaves |")
    print("|---|---|---|---|")
    for r in rows:
        chain_t, tree_t = [], []
        tree = best_first(prefix[-1], lambda d, _: (ids + 10 * d, logp, None), r - 1, r - 1)
        for _ in range(a.repeat):
            t = time.perf_counter()
            ctx.decode([prefix[-1]] + [11] * (r - 1), n_past, "all")
            ctx.logits(0)
            chain_t.append(time.perf_counter() - t)
            ctx.seq_rm(n_past)
            t = time.perf_counter()
            decode_tree(ctx, tree, n_past)
            ctx.logits(0)
            tree_t.append(time.perf_counter() - t)
            keep_path(ctx, tree, [0], n_past)
            ctx.seq_rm(n_past)
        print(f"| {r} | {1e3 * min(chain_t):.2f} | {1e3 * min(tree_t):.2f} | {tree.n_leaves} |")
    print("load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
