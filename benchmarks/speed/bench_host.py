#!/usr/bin/env python3
"""Host cost per draft–verify cycle at Qwen3.6 shapes: vocabulary 248,320, width 5,120.

The real loop (``Engine.generate``) runs on a random-weight ``qwen35`` target
with Qwen3.6-27B's vocabulary and width but five cheap layers, and a
random-weight DFlash drafter of the same width tapping five target layers, at
blocks 4/8/16. Random weights accept nothing, so the drafter is wrapped by the
benchmark-only synthetic drafter (speculative/synthetic.py): the DFlash
drafter does all its work each cycle (feature injection of the committed rows,
one block forward, reading its rows), then its proposal is replaced by the
target's own plain continuation with per-token acceptance α (default 0.84:
τ ≈ 5.9 at block 16 in the long run; each reference position draws once, so a
short run's τ is that run's draws: printed beside every figure). The target
verifies as usual.

**Host** = decode-phase time outside every ``llama_decode`` call (target and
drafter): sampling/verify, the drafter's host side (copying the committed rows'
tapped features into its batch, reading its drafts), batch filling, ctypes,
bookkeeping. It is reported as this thread's CPU time (robust to other processes
on a shared machine; with one llama.cpp thread all compute runs on this thread,
so CPU inside minus CPU total is exact) and as wall time. Besides the loop it
holds the benchmark's own: the synthetic oracle (a slice of draws made before
the run and a compare of the newest history tokens: a few µs a cycle), the decode
timers' call and return (:class:`Timer`, three a cycle) and the list that takes
the tokens. On a CPU each ``llama_decode`` streams the weights through every
cache, so the host work after it runs from DRAM: the same Python costs about ten
times what it costs warm (host_phases.py), and the drafter's feature copy
(taps x width x 4 B a committed row, 100 KB here) reads and writes memory the
decode evicted. A GPU's decode does not sweep the host's caches, so there the same work costs less. Its share of a modeled 20 ms / 30 ms
verify step is host / (verify + host): the fraction of a GPU cycle the card
would wait on the host (a 24 GB card verifies Qwen3.6-27B Q4_K_M in ~20–30 ms).

The target's output norm is scaled so its logits are peaked like a real
model's (random weights alone give near-flat rows, where top-p 0.95 keeps most
of the vocabulary); the sizes of the kept sets are printed.

Variants (all in one process, on the same models and prompt): ``before`` =
the sampler and verify step of main at 5515589 (patched in from this script,
verbatim), the DFlash drafts read from its logits by NumPy; ``host`` = today's
sampler, drafts read by NumPy; ``graph`` = today's sampler, drafts taken by
llama.cpp's in-graph argmax (only ids reach the host: what a GPU build does;
on a CPU that argmax is a scalar loop inside the drafter's ``llama_decode``,
which the drafter decode column shows); ``graph+target`` = ``graph`` with the
target's verify rows sampled in llama.cpp's graph as well (``--sample-in-graph on``:
only token ids reach the host, so the host's share is the loop alone; on a CPU the
graph's sampling ops run inside the target's ``llama_decode``, the target decode
column). Sampled runs of ``graph+target`` are checked against plain decoding on the
same path (llama.cpp's ``dist`` draws differently from localflash's sampler).
Each block also prints the bytes of logits that cross to the host per cycle on
each path (computed from the shapes). ``--slots N`` runs N parallel slots too; with
``--slot-sampling host,graph`` both ways (``slotsN+graph``: each slot's rows sampled by its
request's chain in the graph), with the verify rows' bytes to the host a step.

    .venv/bin/python benchmarks/speed/bench_host.py --json host.json
    .venv/bin/python benchmarks/speed/bench_host.py --blocks 16 --sampling greedy --variants graph --tokens 64 --profile
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np  # noqa: E402

from localflash.bench import rig as bl  # noqa: E402

TARGET_IN_GRAPH = "graph+target"  # the variant whose target rows are sampled in llama.cpp's graph too
SAMPLING = {  # name -> (temperature, top_k, top_p, min_p)
    "greedy": (0.0, 40, 1.0, 0.0),
    "topk40": (0.8, 40, 0.95, 0.05),
    "topp95": (0.8, 0, 0.95, 0.0),  # top-k off: what many OpenAI clients send
}
NORM_SCALE = 12.0  # output norm weight: logit std ~4 over 248,320 tokens (peaked like a real model)


class Timer:
    """Each ``llama_decode`` of a context: its wall and thread-CPU seconds (``ctx._run`` wrapped, as ``bench.rig.Timer``).

    The thread clock is read first on the way in and last on the way out, so the wrapper's own work (the other
    clock, the sums) counts as decode, not as host: what stays in the host figure is its call and return.
    """

    def __init__(self, ctx):
        self.seconds = 0.0
        self.cpu = 0.0  # this thread's CPU seconds inside llama_decode (all of it when n_threads = 1; ~0 with --decode-core)
        self.calls = 0
        if DECODE_CORE is not None:
            DECODE_CORE.move(ctx)
        inner, cpu, wall = ctx._run, time.thread_time, time.perf_counter

        def timed(raw, n):
            c = cpu()
            t = wall()
            inner(raw, n)
            self.seconds += wall() - t
            self.calls += 1
            self.cpu += cpu() - c

        ctx._run = timed


DECODE_CORE = None  # --decode-core: an offcore.DecodeCore that every timed context's decodes run on


def decodes_at_home():
    """Decodes on the calling thread again while calls are counted (the hand-off to --decode-core is the bench's)."""
    return DECODE_CORE.at_home() if DECODE_CORE is not None else contextlib.nullcontext()


SMALL = dict(n_vocab=8192, n_embd=512)  # --small: the same loop on tiny shapes (call counts do not depend on them)


def write_models(work: Path, blocks: list[int], small: bool = False) -> tuple[Path, dict[int, Path]]:
    from localflash.testing.shaped import PRESETS, write_random

    work.mkdir(parents=True, exist_ok=True)
    pool = np.random.default_rng(1).integers(0, 256, size=64 << 20, dtype=np.uint8)
    shape = SMALL if small else {}
    tag = "-small" if small else ""
    spec = replace(PRESETS["qwen3.6-27b"], name="qwen3.6-vocab-5layer" + tag, n_layer=5, n_ff=1024, n_nextn=0, **shape)
    tpath = work / f"{spec.name}-Q4_0.gguf"
    if not tpath.exists():
        write_random(tpath, spec, "Q4_0", pool)
        _scale_tensor(tpath, "output_norm.weight", NORM_SCALE)
    dpaths = {}
    for b in blocks:
        dspec = replace(PRESETS["qwen3.6-27b-dflash"], name=f"qwen3.6-dflash-b{b}{tag}", n_layer=1, n_ff=1024, block_size=b,
                        target_layers=(0, 1, 2, 3, 4), swa_window=0, swa_layers=(), **shape)
        dpaths[b] = work / f"{dspec.name}-Q8_0.gguf"
        if not dpaths[b].exists():
            write_random(dpaths[b], dspec, "Q8_0", pool, mask_token=spec.n_vocab - 1)
    return tpath, dpaths


def write_dense_target(work: Path, small: bool = False) -> Path:
    """An attention-only target of the same vocabulary and width (trees need one: not on hybrid targets)."""
    from localflash.testing.shaped import PRESETS, write_random

    pool = np.random.default_rng(2).integers(0, 256, size=64 << 20, dtype=np.uint8)
    spec = replace(PRESETS["qwen3-32b"], name="qwen3-dense-vocab-5layer" + ("-small" if small else ""), n_layer=5, n_ff=1024,
                   **(SMALL if small else {"n_vocab": 248320}))
    path = work / f"{spec.name}-Q4_0.gguf"
    if not path.exists():
        write_random(path, spec, "Q4_0", pool)
        _scale_tensor(path, "output_norm.weight", NORM_SCALE)
    return path


def plain_reference(target, prompt, n_tokens, sp, threads, in_graph=False) -> list[int]:
    from localflash.llama import Context, ContextOptions
    from localflash.speculative.loop import Engine

    ctx = Context(target, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_outputs_max=1, n_threads=threads, n_rs_seq=1))
    out = [t for new in Engine(target, ctx, sample_in_graph=in_graph).generate(prompt, n_tokens, sp) for t in new]
    ctx.close()
    return out


def run_slots(tpath: Path, dpath: Path, block: int, n_slots: int, a, out: list, in_graph: bool = False) -> None:
    """``n_slots`` parallel slots (speculative/slots.py) on one target context, DFlash drafts for all slots in one
    decode (argmax in the graph), each slot's proposal replaced by the synthetic oracle; target rows on the host, or
    (``in_graph``, variant ``slotsN+graph``) each slot's rows sampled by its request's chain in llama.cpp's graph
    (``--sample-in-graph on``; checked against plain decoding on that path). Host = the pool thread's CPU outside
    llama_decode, per step; calls: the pool thread's."""
    import threading
    from collections import Counter

    from localflash.llama import Context, ContextOptions, Model
    from localflash.llama.graph_sampling import logits_bytes_to_host
    from localflash.speculative.dflash import DFlashGroup
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.slots import SlotPool
    from localflash.speculative.synthetic import SyntheticDrafter, SyntheticGroup

    target = Model(tpath)
    k = block - 1
    rows = n_slots * block
    ctx = Context(target, ContextOptions(n_ctx=1024 * n_slots, n_batch=max(256, rows), n_ubatch=max(256, rows), n_outputs_max=rows,
                                         n_threads=a.threads, n_rs_seq=block, n_seq_max=n_slots, kv_unified=False))
    inner = DFlashGroup(Model(dpath), target, ctx, 1024 + block, n_slots, n_threads=a.threads, in_graph_argmax=True)
    group = SyntheticGroup([SyntheticDrafter(a.alpha, k, target.n_vocab, inner=d) for d in inner.drafters], inner)
    tt, dt = Timer(ctx), Timer(inner.ctx)
    pool = SlotPool(target, ctx, group.drafters, adaptive=False, draft_max=k, group=group, sample_in_graph=in_graph)
    variant = f"slots{n_slots}" + ("+graph" if in_graph else "")
    prompt = [int(x) for x in np.random.default_rng(0).integers(300, target.n_vocab - 1, size=64)]
    try:
        for name in a.sampling.split(","):
            temp, top_k, top_p, min_p = SAMPLING[name]
            sp = SamplingParams(temp, top_k, top_p, min_p, seed=7)
            ref = plain_reference(target, prompt, a.tokens, sp, a.threads, in_graph)
            res = {}
            for counting in (False, True):
                with decodes_at_home() if counting else contextlib.nullcontext():
                    for d in group.drafters:
                        d.set_reference(prompt + ref)
                    outs = [None] * n_slots

                    def go(i):
                        outs[i] = [t for new in pool.slots[i].generate(prompt, a.tokens, sp) for t in new]

                    n, names = [0], Counter()

                    def count(frame, event, arg):
                        if event in ("call", "c_call"):
                            n[0] += 1
                            if a.breakdown:
                                names[_call_name(frame, event, arg)] += 1

                    threads = [threading.Thread(target=go, args=(i,)) for i in range(n_slots)]
                    for s in pool.slots:
                        s.reset()
                    c0, s0, in0, r0 = pool.call(time.thread_time), pool.steps, tt.cpu + dt.cpu, pool.rows_decoded
                    for t in threads:
                        t.start()
                    if counting:  # from the step where every slot decodes (no prefill) to the end
                        while not all(s.request is not None and s.request.state == "decode" for s in pool.slots):
                            time.sleep(0.0005)
                        untimed = [(c, c.__dict__.pop("_run")) for c in (ctx, inner.ctx)]
                        s0 = pool.call(lambda: (sys.setprofile(count), pool.steps)[1])
                    for t in threads:
                        t.join()
                    if counting:
                        steps = pool.call(lambda: (sys.setprofile(None), pool.steps)[1]) - s0
                        for c, run in untimed:
                            c._run = run
                        res["calls"] = n[0] / max(steps, 1)
                        if a.breakdown:
                            print(f"  calls per step by function ({steps} steps):")
                            for fn, c in names.most_common(a.breakdown):
                                print(f"    {c / steps:6.1f}  {fn}")
                    else:
                        steps = pool.steps - s0
                        host = pool.call(time.thread_time) - c0 - (tt.cpu + dt.cpu - in0)
                        res.update(host_us=1e6 * host / steps, steps=steps, same=all(o == ref for o in outs),
                                   bytes=logits_bytes_to_host(pool.rows_decoded - r0, target.n_vocab, in_graph) / steps)
            row = {"block": block, "sampling": name, "variant": variant, "tokens": a.tokens, "slots": n_slots,
                   "steps": res["steps"], "host_cpu_us_per_step": res["host_us"], "python_calls_per_step": res["calls"],
                   "python_calls_per_step_per_slot": res["calls"] / n_slots, "same_as_plain": res["same"],
                   "logits_bytes_to_host_per_step": res["bytes"]}
            out.append(row)
            print(f"block {block:2d} {name:7s} {variant:13s}: host {res['host_us']:7.0f} us/step CPU (prefill steps included), "
                  f"{res['steps']} steps, {res['calls']:.1f} Python calls/step ({res['calls'] / n_slots:.1f} per slot), "
                  f"every slot same as plain {res['same']}, {res['bytes'] / 1e3:.1f} kB of verify rows to the host a step", flush=True)
    finally:
        pool.close()


def run_tree(tpath: Path, dpath: Path, block: int, budget: int, a, out: list) -> None:
    """One stream verifying a DDTree of ``budget`` nodes (speculative/tree.py) drafted by the random-weight DFlash
    drafter itself (its logits read on the host: trees branch on them), on an attention-only target; τ ≈ 1."""
    from localflash.engine import make_drafter
    from localflash.llama import Context, ContextOptions, Model
    from localflash.speculative.loop import Engine
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats
    from localflash.speculative.tree import MAX_LEAVES, TreeVerifier

    target = Model(tpath)
    k = block - 1
    ctx = Context(target, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_outputs_max=max(budget + 1, MAX_LEAVES),
                                         n_threads=a.threads, n_seq_max=MAX_LEAVES, kv_unified=True))
    dflash = make_drafter("dflash", target, ctx, Model(dpath), n_ctx=1024, threads=a.threads, in_graph_argmax=False)
    tt, dt = Timer(ctx), Timer(dflash.ctx)
    eng = Engine(target, ctx, dflash, adaptive=False, draft_max=k)
    eng.tree = TreeVerifier(budget)
    prompt = [int(x) for x in np.random.default_rng(0).integers(300, target.n_vocab - 1, size=64)]
    try:
        for name in a.sampling.split(","):
            temp, top_k, top_p, min_p = SAMPLING[name]
            sp = SamplingParams(temp, top_k, top_p, min_p, seed=7)
            ref = plain_reference(target, prompt, a.tokens, sp, a.threads)
            eng.reset()
            st = Stats()
            gen = eng.generate(prompt, a.tokens, sp, st)
            first = next(gen)
            c0, in0 = time.thread_time(), tt.cpu + dt.cpu
            toks = list(first) + [t for new in gen for t in new]
            host = time.thread_time() - c0 - (tt.cpu + dt.cpu - in0)
            calls = count_calls(eng, prompt, a.tokens, sp, a.breakdown, untimed=(ctx, dflash.ctx))
            row = {"block": block, "sampling": name, "variant": f"tree{budget}", "tokens": a.tokens, "cycles": st.cycles, "tau": st.tau,
                   "mean_tree_nodes": st.mean_tree_nodes, "host_cpu_us_per_cycle": 1e6 * host / st.cycles,
                   "python_calls_per_cycle": calls, "same_as_plain": toks == ref}
            out.append(row)
            print(f"block {block:2d} {name:7s} tree{budget:<8d}: host {row['host_cpu_us_per_cycle']:7.0f} us/cycle CPU, tau {st.tau:.2f}, "
                  f"{st.cycles} cycles, {st.mean_tree_nodes:.1f} nodes a tree, {calls:.1f} Python calls/cycle, same as plain {toks == ref}", flush=True)
    finally:
        eng.close()


def _scale_tensor(path: Path, name: str, scale: float) -> None:
    from gguf import GGUFReader

    r = GGUFReader(str(path), "r+")
    t = next(t for t in r.tensors if t.name == name)
    t.data[...] = t.data * scale
    r.data.flush()


# the sampler and verify step of main before this change (5515589), verbatim, for --before
def _old_filtered_distribution(logits, p):
    n = logits.shape[0]
    if 0 < p.top_k < n:
        ids = np.argpartition(-logits, p.top_k - 1)[: p.top_k]
    else:
        ids = np.arange(n)
    vals = logits[ids].astype(np.float64)
    order = np.lexsort((ids, -vals))
    ids, vals = ids[order], vals[order]
    if p.top_p < 1.0 or p.min_p > 0.0:
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = len(ids)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        ids, vals = ids[: max(keep, 1)], vals[: max(keep, 1)]
    probs = np.exp((vals - vals[0]) / p.temperature)
    return ids, probs / probs.sum()


class OldSampler:
    def __init__(self, params=None):
        from localflash.speculative.sampling import SamplingParams

        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits):
        if self.params.greedy:
            return int(np.argmax(logits))
        ids, probs = _old_filtered_distribution(logits, self.params)
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(ids[min(i, len(ids) - 1)])


def old_verify_block(ctx, draft, sample, is_eog):
    new = []
    for i in range(len(draft) + 1):
        tok = sample(ctx.logits(i if draft else -1))
        new.append(tok)
        if i == len(draft) or tok != draft[i] or is_eog(tok):
            break
    return new


def use_before() -> None:
    from localflash.speculative import grammar, loop

    grammar.Sampler = OldSampler  # the host sampler host_sampler() makes
    loop.verify_block = old_verify_block


def kept_sizes(rows: np.ndarray, params) -> list[int]:
    from localflash.speculative.sampling import kept_set

    return [len(kept_set(r, params)[0]) for r in rows]


def count_calls(eng, prompt, n_tokens, sp, breakdown: int = 0, untimed: tuple = ()) -> float:
    """Python and C function calls per decode cycle (sys.setprofile's call and c_call events), prefill excluded.

    ctypes calls into llama.cpp raise no such event (they are not Python calls). ``untimed``: contexts whose
    :class:`~localflash.bench.rig.Timer` is taken off for the count (its wrapper is the benchmark's, not the
    loop's: five calls a decode). ``breakdown``: also print the functions called most often, per cycle."""
    from collections import Counter

    from localflash.speculative.stats import Stats

    timers = [(c, c.__dict__.pop("_run")) for c in untimed if "_run" in c.__dict__]
    try:
        with decodes_at_home():
            return _count(eng, prompt, n_tokens, sp, breakdown, Counter, Stats)
    finally:
        for c, run in timers:
            c._run = run


def _call_name(frame, event, arg) -> str:
    """A Python function by its name and file; a builtin by its name and its caller's."""
    if event == "call":
        return f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name})"
    return f"{getattr(arg, '__qualname__', repr(arg))} <- {frame.f_code.co_name}"


def _count(eng, prompt, n_tokens, sp, breakdown, Counter, Stats) -> float:
    eng.reset()
    st = Stats()
    gen = eng.generate(prompt, n_tokens, sp, st)
    next(gen)
    n = [0]
    names: Counter = Counter()

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            n[0] += 1
            if breakdown:
                names[_call_name(frame, event, arg)] += 1

    sys.setprofile(count)
    try:
        for _ in gen:
            pass
    finally:
        sys.setprofile(None)
    cycles = max(st.cycles, 1)
    if breakdown:
        print(f"  calls per cycle by function ({cycles} cycles):")
        for name, c in names.most_common(breakdown):
            print(f"    {c / cycles:6.1f}  {name}")
    return n[0] / cycles


def run_block(tpath: Path, dpath: Path, block: int, a, out: list, refs: dict) -> None:
    from localflash.llama import Context, ContextOptions, Model
    from localflash.llama.graph_sampling import logits_bytes_to_host
    from localflash.speculative import grammar, loop
    from localflash.engine import make_drafter
    from localflash.speculative.loop import Engine
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats

    target = Model(tpath)
    k = block - 1
    ctx = Context(target, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_outputs_max=block, n_threads=a.threads, n_rs_seq=block))
    tt = Timer(ctx)
    engines = {}
    for v in a.variants.split(","):  # before/host: NumPy reads the drafter's rows; graph: llama.cpp's graph returns ids
        dflash = make_drafter("dflash", target, ctx, Model(dpath), n_ctx=1024, threads=a.threads, in_graph_argmax=v.startswith("graph"))
        synth = make_drafter(f"synthetic@{a.alpha!r}", target, ctx, max_draft=k, n_ctx=1024, inner=dflash)
        engines[v] = (Engine(target, ctx, synth, adaptive=False, draft_max=k, sample_in_graph=v == TARGET_IN_GRAPH), synth, Timer(dflash.ctx))
    prompt = [int(x) for x in np.random.default_rng(0).integers(300, target.n_vocab - 1, size=64)]
    host_mb, graph_b = logits_bytes_to_host(block, target.n_vocab, False) / 1e6, logits_bytes_to_host(block, target.n_vocab, True)
    print(f"block {block:2d}: logits to host per cycle: {host_mb:.1f} MB (host rows: {block} x {target.n_vocab:,} x 4 B) "
          f"vs {graph_b} B (in graph: {block} token ids)", flush=True)
    out.append({"block": block, "logits_to_host_bytes_per_cycle": {"host": host_mb * 1e6, "graph": graph_b}})
    real = (grammar.Sampler, loop.verify_block)
    try:
        for name in a.sampling.split(","):
            temp, top_k, top_p, min_p = SAMPLING[name]
            sp = SamplingParams(temp, top_k, top_p, min_p, seed=7)
            paths = {"graph" if v == TARGET_IN_GRAPH else "host" for v in engines}
            for path in sorted(paths):  # the oracle's reference: plain decoding, same settings and seed, on each sampling path
                if (name, path) not in refs:  # (the two paths draw differently: speculative/graph_sampler.py)
                    plain_ctx = Context(target, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_outputs_max=1, n_threads=a.threads, n_rs_seq=1))
                    plain = Engine(target, plain_ctx, sample_in_graph=path == "graph")
                    refs[name, path] = [t for new in plain.generate(prompt, a.tokens, sp) for t in new]
                    plain_ctx.close()
            for variant, (eng, synth, dt) in engines.items():
                ref = refs[name, "graph" if variant == TARGET_IN_GRAPH else "host"]
                if variant == "before":
                    use_before()
                synth.off_track = 0
                runs = []
                for rep in range(a.repeat):
                    synth.set_reference(prompt + ref)  # every run draws the same acceptances: the same τ, rows and cycles
                    eng.reset()
                    st = Stats()
                    gen = eng.generate(prompt, a.tokens, sp, st)
                    first = next(gen)
                    prof = cProfile.Profile(time.thread_time) if a.profile else None
                    if prof:
                        prof.enable()
                    t0, d0, c0 = tt.seconds, dt.seconds, time.thread_time()
                    ci0 = tt.cpu + dt.cpu
                    w0 = time.perf_counter()
                    toks = list(first) + [t for new in gen for t in new]
                    wall = time.perf_counter() - w0
                    cpu = time.thread_time() - c0
                    inside_cpu = tt.cpu + dt.cpu - ci0
                    inside = tt.seconds - t0 + dt.seconds - d0
                    if prof:
                        prof.disable()
                        pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile_top)
                    runs.append(dict(cycles=st.cycles, tau=st.tau, host_cpu=cpu - inside_cpu, host_wall=wall - inside,
                                     verify=tt.seconds - t0, draft=dt.seconds - d0, same=toks == ref, hist=list(st.accept_hist)))
                synth.set_reference(prompt + ref)
                calls = calls_timed = None
                if a.count_calls:
                    calls_timed = count_calls(eng, prompt, a.tokens, sp)
                    synth.set_reference(prompt + ref)
                    calls = count_calls(eng, prompt, a.tokens, sp, a.breakdown, untimed=(ctx, synth.inner.ctx))
                grammar.Sampler, loop.verify_block = real
                best = min(runs, key=lambda r: r["host_cpu"])  # interference only ever adds
                cyc = best["cycles"]
                host_us = 1e6 * best["host_cpu"] / cyc
                row = {
                    "block": block, "sampling": name, "variant": variant, "tokens": a.tokens,
                    "cycles": cyc, "tau": best["tau"], "host_cpu_us_per_cycle": host_us,
                    "host_wall_us_per_cycle": 1e6 * best["host_wall"] / cyc,
                    "host_cpu_us_runs": [1e6 * r["host_cpu"] / r["cycles"] for r in runs],
                    "share_20ms": host_us / (host_us + 20000), "share_30ms": host_us / (host_us + 30000),
                    "target_decode_ms_per_cycle": 1e3 * best["verify"] / cyc, "drafter_decode_ms_per_cycle": 1e3 * best["draft"] / cyc,
                    "python_calls_per_cycle": calls, "python_calls_per_cycle_with_timers": calls_timed,
                    "same_as_plain": all(r["same"] for r in runs), "off_track_cycles": synth.off_track, "accept_hist": best["hist"],
                }
                out.append(row)
                print(f"block {block:2d} {name:7s} {variant:12s}: host {host_us:7.0f} us/cycle CPU "
                      f"({row['host_wall_us_per_cycle']:.0f} wall), tau {best['tau']:.2f}, {cyc} cycles, "
                      f"{100 * row['share_20ms']:.2f}% of a 20 ms / {100 * row['share_30ms']:.2f}% of a 30 ms verify, "
                      f"target decode {row['target_decode_ms_per_cycle']:.0f} ms/cycle, drafter decode {row['drafter_decode_ms_per_cycle']:.0f} ms/cycle, same as plain {row['same_as_plain']}"
                      + (f", {calls:.1f} Python calls/cycle ({calls_timed:.1f} with the bench's decode timers)" if calls is not None else ""), flush=True)
            if name != "greedy" and block == 16:  # rows like the loop's: how big the kept sets are
                eng = next(iter(engines.values()))[0]
                eng.reset()
                ctx.sample_on_host()
                ctx.decode(prompt[:-block], 0, "none")
                ctx.decode(prompt[-block:], len(prompt) - block, "all")
                sizes = kept_sizes(ctx.all_logits(), sp)
                eng.reset()
                print(f"  {name}: kept set sizes over a 16-row verify batch: median {statistics.median(sizes):.0f}, max {max(sizes)}")
                out.append({"block": block, "sampling": name, "kept_set_sizes": sizes})
    finally:
        grammar.Sampler, loop.verify_block = real
        for eng, _, _ in engines.values():
            eng.drafter.close()
        ctx.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="4,8,16")
    ap.add_argument("--sampling", default="greedy,topk40,topp95", help=f"comma list of {', '.join(SAMPLING)}")
    ap.add_argument("--tokens", type=int, default=96, help="tokens per run")
    ap.add_argument("--repeat", type=int, default=2, help="runs per setting; the lowest host CPU counts")
    ap.add_argument("--alpha", type=float, default=0.84, help="synthetic per-token acceptance (0.84: tau ~6 at block 16)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default=f"before,host,graph,{TARGET_IN_GRAPH}",
                    help="before: the sampler and verify step of main at 5515589 (drafts read by NumPy); "
                         "host: today's sampler, drafts read by NumPy; graph: today's sampler, drafts as ids from llama.cpp's graph; "
                         f"{TARGET_IN_GRAPH}: drafts and the target's rows sampled in llama.cpp's graph (what a GPU build does)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "localflash" / "bench_host"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-count-calls", dest="count_calls", action="store_false",
                    help="skip the extra run per setting that counts Python calls per cycle")
    ap.add_argument("--slots", default="", help="comma list of parallel slot counts to run as well (e.g. 4,8)")
    ap.add_argument("--slot-sampling", default="host", help="comma list of where the slots' target rows are sampled: host, graph "
                                                            "(each slot's chain in llama.cpp's graph: --sample-in-graph on)")
    ap.add_argument("--tree", type=int, default=0, help="also run one stream verifying a DDTree of this many nodes (e.g. 16)")
    ap.add_argument("--breakdown", type=int, default=0, metavar="N", help="print the N functions called most often per cycle")
    ap.add_argument("--small", action="store_true", help="tiny shapes (vocabulary 8,192, width 512): the same calls per cycle, in seconds")
    ap.add_argument("--decode-core", type=int, default=None, metavar="CORE",
                    help="run every timed llama_decode on a thread pinned to this core, the loop on the others: the decode "
                         "leaves the loop's core's own caches (L1, L2) alone, as a GPU's would; the shared L3 is still swept "
                         "(benchmarks/speed/offcore.py)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions (thread CPU time) of each timed run")
    ap.add_argument("--profile-top", type=int, default=16)
    a = ap.parse_args(argv)
    bl.set_omp_wait("passive")
    global DECODE_CORE
    if a.decode_core is not None:
        from offcore import DecodeCore  # (this folder is on sys.path when run as a script)

        DECODE_CORE = DecodeCore(a.decode_core)
        print(f"decodes on core {a.decode_core}, the loop on cores {sorted(DECODE_CORE.loop_cores)}", flush=True)
    blocks = [int(b) for b in a.blocks.split(",")]
    tpath, dpaths = write_models(Path(a.work), blocks, a.small)
    rows: list = []
    refs: dict = {}
    for b in blocks:
        if a.variants:
            run_block(tpath, dpaths[b], b, a, rows, refs)
        for n in [int(x) for x in a.slots.split(",") if x]:
            for path in a.slot_sampling.split(","):
                run_slots(tpath, dpaths[b], b, n, a, rows, in_graph=path == "graph")
        if a.tree:
            run_tree(write_dense_target(Path(a.work), a.small), dpaths[b], b, a.tree, a, rows)
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": bl.machine_info(), "decode_core": a.decode_core, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
