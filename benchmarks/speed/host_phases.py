#!/usr/bin/env python3
"""Where bench_host's in-graph cycle (``graph+target``, block 16, greedy) spends its host CPU, phase by phase.

Two measurements on bench_host's random-weight models (``--small``: its tiny shapes):

1. The real loop (hybrid target, DFlash drafter wrapped by the synthetic oracle, sampling in the graph):
   each phase's thread CPU outside ``llama_decode`` per cycle (phases nest: the indented ones are parts
   of the line above).
2. The same chain cycle (``Engine._chain_cycle``) on an attention-only target with every ``llama_decode``
   replaced by a pass over ``--evict`` MB of memory (0: nothing), its CPU subtracted like a decode's:
   what the loop's Python and ctypes cost with warm caches, and how much a decode's eviction adds.
   (The ids read back are the last real decode's, so acceptance differs; each cycle also rolls the drafter back.)

At Qwen3.6 shapes (no ``--small``) the drafter intake also copies each committed row's tapped features
(5 x 5,120 x 4 B) from memory the target decode evicted: ~100 us a cycle at tau ~3 on the 2-core dev VM,
about a quarter of the host figure; llama.cpp's own cold calls (two ``llama_memory_seq_rm``, two
``llama_get_logits``) add ~70 us.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/speed/host_phases.py --small --evict 0,8,64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import bench_host as bh  # noqa: E402  (the script's folder is on sys.path when run as a script)


def _engine(target, dpath):
    from localflash.engine import make_drafter
    from localflash.llama import Context, ContextOptions
    from localflash.speculative.loop import Engine

    ctx = Context(target, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_outputs_max=16, n_threads=1, n_rs_seq=16))
    from localflash.llama import Model

    dflash = make_drafter("dflash", target, ctx, Model(dpath), n_ctx=1024, threads=1, in_graph_argmax=True)
    synth = make_drafter("synthetic@0.84", target, ctx, max_draft=15, n_ctx=1024, inner=dflash)
    return ctx, dflash, synth, Engine(target, ctx, synth, adaptive=False, draft_max=15, sample_in_graph=True)


def phases(tpath, dpath, n_tokens: int) -> None:
    from localflash.llama import Model
    from localflash.speculative import loop
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats

    target = Model(tpath)
    ctx, dflash, synth, eng = _engine(target, dpath)
    prompt = [int(x) for x in np.random.default_rng(0).integers(300, target.n_vocab - 1, size=64)]
    sp = SamplingParams(0.0, 40, 1.0, 0.0, seed=7)
    ref = bh.plain_reference(target, prompt, n_tokens, sp, 1, in_graph=True)
    inside, acc = [0.0], {}
    for c in (ctx, dflash.ctx):
        def run(raw, n, inner=c._run):
            t = time.thread_time()
            inner(raw, n)
            inside[0] += time.thread_time() - t
        c._run = run

    def wrap(obj, name, label):
        f = getattr(obj, name)

        def w(*a, **k):
            t, i0 = time.thread_time(), inside[0]
            r = f(*a, **k)
            acc[label] = acc.get(label, 0.0) + (time.thread_time() - t) - (inside[0] - i0)
            return r
        setattr(obj, name, w)

    labels = []

    def wrap(obj, name, label, wrap=wrap):
        labels.append(label)
        wrap(obj, name, label)

    wrap(synth, "propose", "draft (block decode call, ids read, noise cut)")
    wrap(dflash.ctx, "decode", "  the drafter's decode call (batch fill)")
    wrap(dflash.ctx, "sampled_rows", "  the ids read")
    wrap(dflash.ctx, "seq_rm", "  the drafter's seq_rm")
    wrap(ctx, "decode", "target decode call (batch fill)")
    wrap(loop, "verify_block", "verify (ids read, compared, accepted)")
    wrap(eng, "_cut", "target cut (seq_rm)")
    wrap(synth, "on_target_decode", "drafter intake (layer inputs, features copied, embd decode call)")
    wrap(dflash.ctx, "decode_embd", "  decode_embd (copy + call)")
    for _ in range(2):  # the second run counts
        synth.set_reference(prompt + ref)
        eng.reset()
        st = Stats()
        gen = eng.generate(prompt, n_tokens, sp, st)
        first = next(gen)
        acc.clear()
        inside[0] = 0.0
        c0 = time.thread_time()
        toks = list(first) + [t for new in gen for t in new]
        host = time.thread_time() - c0 - inside[0]
    cy = st.cycles
    print(f"real loop: host {host / cy * 1e6:.0f} us/cycle CPU over {cy} cycles (tau {st.tau:.2f}), same as plain {toks == ref}; "
          "by phase, outside llama_decode:")
    for k in labels:
        print(f"  {acc.get(k, 0.0) / cy * 1e6:7.1f} us  {k}")
    eng.close()


def warm(dense_path, dpath, evict_mb: list[int]) -> None:
    from localflash.llama import Model
    from localflash.speculative.graph_sampler import request_sampler
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats

    target = Model(dense_path)
    ctx, dflash, synth, eng = _engine(target, dpath)
    prompt = [int(x) for x in np.random.default_rng(0).integers(300, target.n_vocab - 1, size=72)]
    sp = SamplingParams(0.0, 40, 1.0, 0.0, seed=7)
    sample = request_sampler(ctx, sp, True)
    eng._prefill(prompt[:-1], Stats())
    n_past = len(eng.tokens)
    synth.inner.propose(prompt, n_past, 15)  # real decodes last: their ids fill the sampled buffers
    ctx.decode([prompt[-1]] + [5] * 15, n_past, "all")
    eng._cut(n_past)
    synth.set_reference(prompt + [5] * 600)
    real = (ctx._run, dflash.ctx._run)
    for mb in evict_mb:
        big = np.zeros(max(mb, 1) << 18, np.float32)
        inside = [0.0]

        def run(raw, n):
            if mb:
                t = time.thread_time()
                big.__iadd__(1.0)
                inside[0] += time.thread_time() - t
        ctx._run = dflash.ctx._run = run
        best, st = float("inf"), Stats()
        for _ in range(5):
            inside[0] = 0.0
            t0 = time.thread_time()
            for _ in range(200):
                del eng.tokens[n_past:]
                eng.drafter.rollback(n_past)  # (the drafter back where it drafts again: one seq_rm more a cycle)
                eng._chain_cycle(list(prompt), prompt[-1], n_past, 15, sample, st)
            best = min(best, (time.thread_time() - t0 - inside[0]) / 200)
        print(f"chain cycle, decodes replaced by a pass over {mb} MB: host {best * 1e6:.1f} us CPU")
    ctx._run, dflash.ctx._run = real
    eng.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--evict", default="0,8,64", help="MB passed over in place of each decode (comma list; empty: skip)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "localflash" / "bench_host"))
    a = ap.parse_args(argv)
    tpath, dpaths = bh.write_models(Path(a.work), [16], a.small)
    phases(tpath, dpaths[16], a.tokens)
    if a.evict:
        warm(bh.write_dense_target(Path(a.work), a.small), dpaths[16], [int(x) for x in a.evict.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
