"""Why --tree is refused on hybrid (qwen35) targets: what one tree pass does there, and what it would cost.

On a tiny random-weight qwen35 (Gated-DeltaNet + attention): a 10-node tree through llama.cpp's
sequence masking, each node's logits against a decode of its own path; the recurrent state of one
sequence; a tree pass against a chain pass of as many rows (best of 5: llama.cpp splits a batch of
branching sequences into one micro-batch per sequence set on recurrent memory). Then the state one
sequence of Qwen3.6-27B needs (from its shaped metadata): every branch of a tree would need its own,
and its own rollback snapshots.

    python benchmarks/conformance/tree_on_hybrid.py
"""
import tempfile
import time

import numpy as np
from pathlib import Path

from localflash.formats.gguf_meta import read_meta
from localflash.testing.shaped import write_preset
from localflash.llama import Context, ContextOptions, Model
from localflash.llama.bindings import lib
from localflash.speculative.tree import depth_first, decode_tree
from localflash.testing.tiny import HybridSpec, write_hybrid
tmp = Path(tempfile.mkdtemp())
p = write_hybrid(tmp / "qwen35.gguf", HybridSpec(seed=3))
m = Model(p)
prefix = m.tokenize("the river of quiet stone and nine silver hills")
tokens = [prefix[-1], 100, 101, 102, 200, 201, 300, 301, 302, 303]
parents = [-1, 0, 1, 2, 1, 4, 0, 6, 6, 6]
tree = depth_first(tokens, parents, [0.0]*len(tokens))
def ctx(n_seq): return Context(m, ContextOptions(n_ctx=512, n_batch=64, n_ubatch=64, n_outputs_max=16, n_threads=1, n_seq_max=n_seq))
c = ctx(8)
n_past = len(prefix) - 1
c.decode(prefix[:-1], 0, "none")
L = lib()
size = L.llama_state_seq_get_size_ext(c.ptr, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
print(f"tiny qwen35: recurrent state of one sequence {size} bytes")
err = None
try:
    decode_tree(c, tree, n_past)
    got = c.all_logits().copy()
except Exception as e:
    err = e
print("tree pass:", "error " + repr(err) if err else "ran")
if not err:
    worst = 0.0
    for node in range(tree.n):
        path = tree.path(node)
        r = ctx(1); r.decode(prefix[:-1], 0, "none"); r.decode(tree.tokens[path], n_past, "all")
        d = float(np.abs(r.all_logits()[-1] - got[node]).max()); worst = max(worst, d)
        print(f"node {node} path {path}: max |Δlogit| {d:.3g}")
        r.close()
    print("worst", worst)
# timing: 10-node tree vs 10-row chain, same context kind (best of 5)
def best(fn):
    t = []
    for _ in range(5):
        t0 = time.perf_counter(); fn(); t.append(time.perf_counter() - t0)
    return min(t)
c2 = ctx(8); c2.decode(prefix[:-1], 0, "none"); c2.checkpoint(transient=True)
def chain():
    c2.decode(tokens, n_past, "all"); c2.restore(c2._scratch)
def treep():
    decode_tree(c2, tree, n_past)
    for s in range(1, tree.n_leaves): c2.seq_drop(s)
    c2.restore(c2._scratch)
try:
    print(f"chain 10 rows {1e3*best(chain):.2f} ms, tree 10 nodes {1e3*best(treep):.2f} ms")
except Exception as e:
    print("timing failed", repr(e))
meta = read_meta(write_preset(tmp, "qwen3.6-27b"))
state = meta.recurrent_row_bytes
print(f"Qwen3.6-27B: {state / 2**20:.1f} MiB of recurrent state per sequence; 16 branches x (1 + 16 snapshots): "
      f"{16 * 17 * state / 2**30:.1f} GiB")
