#!/usr/bin/env python3
"""What idle cached conversations cost the active one in a unified KV pool, against split streams.

One target context of 8,192 cells and 4 sequences, built twice: ``kv_unified`` true (``--kv-pool unified``, the
serve default with ``--parallel``) and false (``--kv-pool split``, each sequence its own stream of n_ctx / 4, as
llama-server's ``-np 4``). Sequence 0 holds L tokens and decodes one token at a time (decode, read the logits,
cut it again: the state stays the same); with IDLE=1 sequences 1-3 each hold L cached tokens as well (idle slots
keeping their conversations for the next turn), with IDLE=0 they are empty. The two contexts alternate, 10 rounds
of 5 tokens; the median ms a token of each is printed. In a unified cache llama.cpp's attention spans every used
cell (masked per sequence), so the idle slots' cells cost every active row; split streams do not see them.

    .venv/bin/python benchmarks/speed/kv_idle_cells.py 1500 1     # L=1500, three idle caches of 1500
    .venv/bin/python benchmarks/speed/kv_idle_cells.py 1500 0     # L=1500, no idle caches

MODEL (env) names the target; default Qwen2.5-Coder 1.5B Q4_K_M from ~/.cache/localflash (scripts/get_bench_models.sh).
"""
import os
import sys
import time

import numpy as np

os.environ.setdefault("GOMP_SPINCOUNT", "3000")
from localflash.llama.bindings import lib  # noqa: E402
from localflash.llama.runtime import Context, ContextOptions, Model  # noqa: E402

M = os.path.expanduser(os.environ.get("MODEL", "~/.cache/localflash/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
L = int(sys.argv[1]); idle = int(sys.argv[2]) if len(sys.argv) > 2 else 1
m = Model(M)
ctxs = {}
for name, uni in (("unified", True), ("split", False)):
    c = Context(m, ContextOptions(n_ctx=8192, n_seq_max=4, kv_unified=uni, n_threads=2))
    for s in range(4 if idle else 1):
        toks = [(100 + 7 * i + s) % 5000 for i in range(L)]
        for a in range(0, L, 500):
            b = min(L, a + 500)
            c.decode_rows(toks[a:b], np.arange(a, b), [s] * (b - a), [0] * (b - a - 1) + [1])
    ctxs[name] = c
lb = lib()
res = {k: [] for k in ctxs}
for rep in range(10):
    for name in (list(ctxs) if rep % 2 == 0 else list(ctxs)[::-1]):
        c = ctxs[name]
        t = time.perf_counter()
        for _ in range(5):
            c.decode_rows([11], [L], [0], [1]); c.all_logits()
            lb.llama_memory_seq_rm(c.mem, 0, L, -1)
        res[name].append((time.perf_counter() - t) / 5)
for k, v in res.items():
    v = sorted(v)
    print(f"L={L} idle_slots_cached={idle} {k}: median {1000*v[len(v)//2]:.1f} ms/token min {1000*v[0]:.1f}")
