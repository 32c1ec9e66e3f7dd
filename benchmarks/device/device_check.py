#!/usr/bin/env python3
"""GPU device check: speed of the real engine on real-shaped, random-weight models.

Run by benchmarks/device/device_check.sh (which builds llama-cpp-python with CUDA first).
For an 8B-class target (Qwen3-8B shapes, ``qwen3``) and a 27B-class target
(Qwen3.6-27B shapes, hybrid ``qwen35``), both Q4_K_M, each with a matching
DFlash drafter (Q8_0), it measures and writes to JSON after every stage:

- AR (plain) decode tok/s against the memory-bandwidth roofline
  (bytes read per token = weights except the token embedding + KV cache);
- target verify cost for batches of 1..16 tokens;
- drafter cost (one DFlash block forward; feature injection per row count);
- host overhead per cycle (decode time outside llama_decode);
- the engine's tok/s as a function of acceptance length, with a
  BENCHMARK-ONLY ORACLE that commits exactly k drafted tokens per cycle
  (random weights accept nothing, so acceptance is forced to time the real
  loop at τ = k + 1). The oracle lives only in this script, patches the
  engine's verify step for the duration of the sweep, and every figure it
  produces is labelled ``oracle`` in the JSON;
- greedy plain vs speculative output on the GPU: the first divergence and
  the target's top-2 logit margin there (kernels differ by batch size).

Stage ``27b-mtp`` (run before ``27b``, on the same target file: the Qwen3.6-27B
preset carries its MTP/nextn block) loads the hybrid target the way ``localflash
run --spec mtp`` does (``open_engine``: the planner's plan, the MTP block loaded; on a GPU build the
target's rows sampled in llama.cpp's graph, ``--sample-in-graph auto``)
and measures plain decode tok/s (a second context on the same weights), MTP
speculative decode tok/s at the default draft length, acceptance (random
weights: the MTP block's drafts are almost never the trunk's token, so expect
~0; the stage measures the cost of drafting and verifying, not a speed-up),
greedy plain vs MTP output (first divergence and its top-2 margin), and the
device memory the load took (``nvidia-smi`` memory.used before and after, and
NVML's per-process figure where ``nvidia-ml-py`` is importable) against the
planner's price for that load.

Weights are real random values, not zeros: a 64 MiB random byte pool is
tiled through every quantized tensor and each block's scale fields are set
so the dequantized weights are small (no inf/NaN). Zero weights would be
numerically degenerate (every logit 0) and draw less power than real data
(this workplace measured 894 vs 788 TFLOP/s on zeros vs random bf16 on an
H200), so random data gives the honest timing.

``--cpu-dry-run`` runs every stage with tiny shapes on the CPU in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np  # noqa: E402

from localflash.testing.shaped import PRESETS, ModelSpec, write_random  # noqa: E402

ORACLE_LABEL = "BENCHMARK-ONLY ORACLE: commits exactly k drafted tokens per cycle whatever the target says; not model output"

# Qwen3-8B (config.json: 36 layers, hidden 4096, intermediate 12288, 32/8 heads, head_dim 128, vocab 151936)
QWEN3_8B = ModelSpec("qwen3", "Qwen3-8B-shaped", n_layer=36, n_embd=4096, n_ff=12288, n_head=32, n_head_kv=8, head_dim=128,
                     n_vocab=151936, n_ctx_train=40960)
# a DFlash drafter for it in the style of z-lab's (5 Qwen3 blocks, block 16; target layer ids + 1 as llama.cpp counts)
QWEN3_8B_DFLASH = ModelSpec("dflash", "Qwen3-8B-DFlash-shaped", n_layer=5, n_embd=4096, n_ff=12288, n_head=32, n_head_kv=8,
                            head_dim=128, n_vocab=151936, n_ctx_train=40960, target_layers=(2, 10, 18, 26, 34))
# tag -> (target, drafter); a None drafter: the target's own MTP block (stage 27b-mtp, check_mtp)
MODELS = {
    "8b": (QWEN3_8B, QWEN3_8B_DFLASH),
    "27b-mtp": (PRESETS["qwen3.6-27b"], None),
    "27b": (PRESETS["qwen3.6-27b"], PRESETS["qwen3.6-27b-dflash"]),
}
# cheapest proof first: the 8B target (smallest file), the hybrid's MTP stage (no drafter file, no oracle sweep),
# then the 27B DFlash stage on the same target file (its oracle sweep runs as long as the budget lets it)
DEFAULT_TARGETS = "8b,27b-mtp,27b"
# tiny stand-ins for --cpu-dry-run: the same architectures, every dimension small; the hybrid keeps one MTP block
TINY_QWEN35 = replace(PRESETS["qwen3.6-27b"], name="tiny-qwen35-mtp", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                      head_dim=64, n_vocab=4096, linear_k_heads=2, linear_v_heads=4, linear_head_dim=64, n_nextn=1)
TINY = {
    "8b": (replace(QWEN3_8B, name="tiny-qwen3", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, n_vocab=4096),
           replace(QWEN3_8B_DFLASH, name="tiny-qwen3-dflash", n_layer=1, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                   n_vocab=4096, target_layers=(1, 3))),
    "27b": (TINY_QWEN35,
            replace(PRESETS["qwen3.6-27b-dflash"], name="tiny-qwen35-dflash", n_layer=2, n_embd=256, n_ff=512, n_head=4,
                    n_head_kv=2, head_dim=64, n_vocab=4096, target_layers=(1, 3), swa_window=0, swa_layers=())),
    "27b-mtp": (TINY_QWEN35, None),  # the same tiny hybrid with one MTP block (blk.4.nextn.*), as on the device
}


class Report:
    """The JSON result, rewritten after every stage so a timeout keeps what was measured."""

    def __init__(self, path: Path, deadline: float):
        self.path = path
        self.deadline = deadline
        self.data: dict = {"stages": {}, "skipped": []}

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1), encoding="utf-8")

    def stage(self, key: str, value) -> None:
        self.data["stages"][key] = value
        self.save()

    def skip(self, what: str) -> None:
        self.data["skipped"].append(what)
        self.save()
        log(f"skipped: {what}")


def greedy_equality(ctx, prompt: list[int], base: list[int], spec: list[int], on_host: bool = False) -> dict:
    """Plain vs speculative greedy tokens: equal?, the first divergence, and there the plain row's top-2 logit margin
    (``ctx`` is cleared and the prompt plus the common prefix decoded again to read that row; ``on_host``: detach
    an in-graph sampler chain first, which leaves only ids)."""
    first = next((i for i, (x, y) in enumerate(zip(base, spec)) if x != y), None)
    eq = {"tokens": min(len(base), len(spec)), "equal": base == spec, "first_divergence": first}
    if first is not None:
        if on_host:
            ctx.sample_on_host()
        ctx.clear()
        hist = prompt + base[:first]
        for off in range(0, len(hist), 512):
            ch = hist[off : off + 512]
            ctx.decode(ch, off, "last" if off + len(ch) == len(hist) else "none")
        top = np.sort(ctx.logits(-1))[-2:]
        eq["top2_margin_at_divergence"] = float(top[1] - top[0])
    return eq


def log(msg: str) -> None:
    print(f"[device_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- measurements -----------------------------------------------------------------

def sync(ctx) -> None:
    from localflash.llama.bindings import lib

    lib().llama_synchronize(ctx.ptr)


def time_decode(ctx, tokens: list[int], pos: int, reps: int) -> float:
    """Median seconds of decoding ``tokens`` at ``pos`` with all rows output (rolled back after each).

    A recurrent target cannot cut a whole decode off: ``rewind`` restores its checkpoint at ``pos`` (untimed).
    """
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        ctx.decode(tokens, pos, "all")
        sync(ctx)
        ctx.logits(0)
        out.append(time.perf_counter() - t)
        assert ctx.rewind(pos) == pos
    return statistics.median(out)


def gpu_info() -> dict:
    info: dict = {}
    try:
        q = "name,memory.total,clocks.max.memory,driver_version,compute_cap"
        line = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
        name, mem, mclk, drv, cc = [x.strip() for x in line.split(",")]
        info.update(name=name, memory_mib=int(float(mem)), mem_clock_mhz=float(mclk), driver=drv, compute_cap=cc)
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired) as e:
        info["error"] = str(e)
    spec = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "4090": 1.008e12, "3090": 0.936e12, "5090": 1.792e12}
    for key, bw in spec.items():
        if key in info.get("name", ""):
            info["spec_bandwidth_Bps"] = bw
    try:
        import torch

        if torch.cuda.is_available():
            n = 1 << 30
            a = torch.empty(n, dtype=torch.uint8, device="cuda")
            b = torch.empty_like(a)
            for _ in range(3):
                b.copy_(a)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(10):
                b.copy_(a)
            torch.cuda.synchronize()
            info["measured_copy_Bps"] = 2 * n * 10 / (time.perf_counter() - t)  # read + write
            del a, b
            torch.cuda.empty_cache()
    except ImportError:
        pass
    return info


@contextmanager
def oracle(k: int, safe_token: int):
    """Patch the engine's verify step: commit exactly ``k`` drafted tokens plus the target's token at row k."""
    from localflash.speculative import loop

    real = loop.verify_block

    def verify(ctx, draft, sample, is_eog):
        n = min(k, len(draft))
        rows = [sample(ctx.logits(i if draft else -1)) for i in range(n + 1)]  # the host work of a real verify
        out = list(draft[:n]) + [rows[n]]
        return [safe_token if is_eog(t) else t for t in out]

    loop.verify_block = verify
    try:
        yield
    finally:
        loop.verify_block = real


def check_target(tag: str, tpath: Path, dpath: Path, rep: Report, a) -> None:
    from localflash.bench import rig as bl

    from localflash.llama import Context, ContextOptions, Model, ModelOptions
    from localflash.engine import make_drafter
    from localflash.speculative.loop import Engine
    from localflash.archs import RECURRENT_ARCHS

    res: dict = {"target": tpath.name, "drafter": dpath.name}
    t = time.perf_counter()
    target = Model(tpath, ModelOptions(n_gpu_layers=a.ngl))
    res["load_s"] = time.perf_counter() - t
    res["target_bytes"] = target.size_bytes
    res["target_params"] = target.n_params
    res["arch"] = target.arch
    n_rs = 17 if target.arch in RECURRENT_ARCHS else 0
    rng = np.random.default_rng(1)
    prompt = rng.integers(300, target.n_vocab - 1, size=a.prompt).tolist()
    ctx = Context(target, ContextOptions(n_ctx=a.ctx, n_outputs_max=16, n_threads=a.threads, n_rs_seq=n_rs))
    ttimer = bl.Timer(ctx, sync=True)
    # 1. AR decode vs the roofline
    plain = Engine(target, ctx)
    st = None
    from localflash.speculative.stats import Stats

    for n_tok in (8, a.ar_tokens):  # warm-up, then measure
        st = Stats()
        for _ in plain.generate(prompt, n_tok, None, st):
            pass
        plain.reset()
    ar = (st.generated - 1) / st.t_decode
    embd = target.n_vocab * target.n_embd * 0.5625  # Q4_K: 4.5 bits per weight; only one row of token_embd is read per token
    per_token = target.size_bytes - embd
    bw = rep.data["gpu"].get("measured_copy_Bps") or rep.data["gpu"].get("spec_bandwidth_Bps")
    res["ar"] = {"tok_s": ar, "tokens": st.generated, "bytes_per_token_weights": per_token,
                 "roofline_tok_s": bw / per_token if bw else None, "efficiency": ar * per_token / bw if bw else None,
                 "bandwidth_Bps_used_for_roofline": bw, "note": "roofline ignores KV reads (short context) and the embedding row"}
    log(f"{tag}: AR {ar:.1f} tok/s" + (f", roofline {bw / per_token:.1f} tok/s ({100 * ar * per_token / bw:.0f}%)" if bw else ""))
    rep.stage(tag, res)
    # 2. verify cost for batches 1..16 at position len(prompt)
    ctx.clear()
    ctx.decode(prompt, 0, "last")
    sync(ctx)
    ctx.checkpoint()  # where time_decode's cuts go back to (a recurrent target; attention-only: none needed)
    res["verify_s"] = {n: time_decode(ctx, prompt[:n], len(prompt), a.reps) for n in range(1, 17)}
    log(f"{tag}: verify ms " + " ".join(f"{n}:{1000 * s:.2f}" for n, s in res["verify_s"].items()))
    rep.stage(tag, res)
    if rep.left() < 30:
        rep.skip(f"{tag}: drafter, oracle and equality stages (time)")
        return
    # 3. drafter cost
    drafter = make_drafter("dflash", target, ctx, Model(dpath, ModelOptions(n_gpu_layers=a.ngl)), n_ctx=a.ctx, threads=a.threads)
    dtimer = bl.Timer(drafter.ctx, sync=True)
    ctx.clear()
    ctx.decode(prompt, 0, "last")
    drafter.on_target_decode(ctx, 0, len(prompt))
    drafter.catch_up()  # the prompt's rows in now: not inside the first timed draft
    block = [prompt[-1]] + [drafter.mask] * drafter.max_draft
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        drafter.propose(prompt, len(prompt), drafter.max_draft)
        sync(drafter.ctx)
        times.append(time.perf_counter() - t0)
    res["draft_block_s"] = statistics.median(times)
    inj = {}
    width = len(drafter.layer_ids) * target.n_embd
    for rows in (1, 4, 8, 16):
        feats = np.zeros((rows, width), np.float32)
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            drafter.ctx.decode_embd(feats, len(prompt))
            sync(drafter.ctx)
            ts.append(time.perf_counter() - t0)
            drafter.ctx.seq_rm(len(prompt))
        inj[rows] = statistics.median(ts)
    res["inject_s"] = inj
    res["block_size"] = drafter.block_size
    log(f"{tag}: DFlash block forward {1000 * res['draft_block_s']:.2f} ms (block {len(block)}), inject 16 rows {1000 * inj[16]:.2f} ms")
    rep.stage(tag, res)
    # 4. oracle sweep: tok/s and host overhead vs acceptance length
    safe = 300
    sweep = {}
    for mode in ("block", "exact"):
        for k in range(0, drafter.max_draft + 1):
            if rep.left() < 20:
                rep.skip(f"{tag}: oracle {mode} k>={k} (time)")
                break
            dmax = drafter.max_draft if mode == "block" else k  # exact k=0 is plain decoding
            eng = Engine(target, ctx, drafter, adaptive=False, draft_max=dmax)
            eng.reset()
            st = Stats()
            with oracle(k, safe):
                gen = eng.generate(prompt, a.oracle_tokens, None, st)
                next(gen)  # prefill; the decode phase starts here
                t_before = (ttimer.seconds, dtimer.seconds)
                for _ in gen:
                    pass
            t_tgt = ttimer.seconds - t_before[0]
            t_dft = dtimer.seconds - t_before[1]
            host = max(0.0, st.t_decode - t_tgt - t_dft)
            sweep[f"{mode}-{k}"] = {
                "mode": mode, "k": k, "draft_len": dmax, "tau": st.tau,
                "tok_s": (st.generated - 1) / st.t_decode if st.t_decode else 0.0, "cycles": st.cycles,
                "target_ms_per_cycle": 1000 * t_tgt / max(st.cycles, 1), "draft_ms_per_cycle": 1000 * t_dft / max(st.cycles, 1),
                "host_ms_per_cycle": 1000 * host / max(st.cycles, 1), "host_share": host / st.t_decode if st.t_decode else 0.0,
            }
        res["oracle"] = {"label": ORACLE_LABEL, "plain_tok_s": ar, "runs": sweep}
        rep.stage(tag, res)
    if sweep:
        best = max(sweep.values(), key=lambda r: r["tok_s"])
        log(f"{tag}: oracle best {best['tok_s']:.1f} tok/s at {best['mode']} k={best['k']} (tau {best['tau']:.2f}); "
            f"host ms/cycle {statistics.median(r['host_ms_per_cycle'] for r in sweep.values()):.3f}")
    # 5. greedy plain vs real speculative (GPU kernels differ by batch size)
    if rep.left() > 20:
        eng = Engine(target, ctx, drafter, adaptive=False, draft_max=drafter.max_draft)
        plain.reset()
        base = [tok for c in plain.generate(prompt, a.eq_tokens) for tok in c]
        plain.reset()
        ctx.capture_layer_inputs(drafter.layer_ids)
        spec = [tok for c in eng.generate(prompt, a.eq_tokens) for tok in c]
        eng.reset()
        eq = res["greedy_equality"] = greedy_equality(ctx, prompt, base, spec)
        log(f"{tag}: greedy plain vs DFlash: {eq}")
        rep.stage(tag, res)
    else:
        rep.skip(f"{tag}: greedy equality (time)")
    drafter.close()
    ctx.close()
    target.close()


def gpu_memory_used() -> dict:
    """Device memory in use now: nvidia-smi's memory.used of GPU 0 (the whole card; this check is its only user) and,
    where ``nvidia-ml-py`` is importable, what NVML attributes to this process (empty inside some containers)."""
    out: dict = {}
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
        out["card_used_bytes"] = int(float(line)) * 2**20
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired) as e:
        out["card_error"] = str(e)
    try:
        from localflash.plan.devices import used_by_process

        out["process_bytes"] = used_by_process(os.getpid()).get(0)
    except Exception as e:  # no pynvml, or NVML without this process's view
        out["process_error"] = f"{type(e).__name__}: {e}"
    return out


def greedy_tokens(engine, prompt: list[int], n: int, st) -> list[int]:
    return [tok for c in engine.generate(prompt, n, None, st) for tok in c]


def check_mtp(tag: str, tpath: Path, rep: Report, a) -> None:
    """The hybrid target with its own MTP block as drafter, loaded as ``localflash run --spec mtp`` loads it."""
    from dataclasses import asdict

    from localflash.config import config_from
    from localflash.engine import open_engine
    from localflash.plan.devices import detect
    from localflash.speculative.stats import Stats

    res: dict = {"target": tpath.name, "drafter": "the target's MTP (nextn) block", "spec": "mtp"}
    vram = None
    if a.ngl != 0 and not detect():  # no nvidia-ml-py: plan for the card nvidia-smi reports (else the plan is CPU-only)
        total = rep.data["gpu"].get("memory_mib")
        vram = f"{total}MiB" if total else None
        res["plan_vram_from_nvidia_smi"] = vram
    cfg = config_from(None, str(tpath), None, spec="mtp", ctx=a.ctx, threads=a.threads, n_gpu_layers=a.ngl, adaptive=False,
                      vram=vram)
    before = gpu_memory_used() if a.ngl != 0 else {}
    t = time.perf_counter()
    mtp = open_engine(cfg)
    res["load_s"] = time.perf_counter() - t
    after = gpu_memory_used() if a.ngl != 0 else {}
    plan = mtp.plan
    target = mtp.target
    res["arch"], res["target_bytes"], res["n_layer_nextn"] = target.arch, target.size_bytes, target.n_layer_nextn
    res["draft_max"] = mtp.drafter.max_draft
    rows = [asdict(d) | {"used": d.used} for d in plan.devices]
    price = sum(d.used for d in plan.devices)
    mem = {"plan": {"n_ctx": plan.n_ctx, "n_gpu_layers": plan.n_gpu_layers, "type_k": plan.type_k, "devices": rows,
                    "host": asdict(plan.host) | {"used": plan.host.used}, "gpu_bytes": price}, "before": before, "after_load": after}
    if after.get("card_used_bytes") is not None and before.get("card_used_bytes") is not None:
        got = after["card_used_bytes"] - before["card_used_bytes"]
        # the plan's runtime overhead (CUDA context, cuBLAS workspace, pool) may already be in "before" (this process's
        # CUDA context is made by llama.cpp's CUDA backend or an earlier stage): both comparisons are kept
        overhead = sum(d.overhead for d in plan.devices)
        mem["measured_card_delta_bytes"] = got
        mem["plan_overhead_bytes"] = overhead
        mem["error_vs_plan"] = (price - got) / got if got else None
        mem["error_vs_plan_without_overhead"] = (price - overhead - got) / got if got else None
        log(f"{tag}: device memory taken by the load {got / 2**30:.2f} GiB (nvidia-smi delta; card at "
            f"{before['card_used_bytes'] / 2**30:.2f} GiB before), planner {price / 2**30:.2f} GiB "
            f"({(price - overhead) / 2**30:.2f} GiB without its {overhead / 2**20:.0f} MiB runtime overhead)")
    else:
        log(f"{tag}: planner prices the load at {price / 2**30:.2f} GiB on the GPU(s); no device memory to compare it with"
            + (" (CPU dry run)" if a.ngl == 0 else ""))
    res["memory"] = mem
    rep.stage(tag, res)
    plain = open_engine(replace(cfg, spec="none"), target=target)  # a context of its own on the same weights
    rng = np.random.default_rng(1)
    prompt = rng.integers(300, target.n_vocab - 1, size=a.prompt).tolist()
    runs = {}
    for name, eng in (("plain", plain), ("mtp", mtp)):
        for n_tok in (8, a.ar_tokens):  # warm-up, then measure
            eng.reset()
            st = Stats()
            toks = greedy_tokens(eng, prompt, n_tok, st)
        eng.reset()
        runs[name] = (toks, st)
        res[name] = {"tok_s": (st.generated - 1) / st.t_decode if st.t_decode else 0.0, "tokens": st.generated, "cycles": st.cycles,
                     "drafted": st.drafted, "accepted": st.accepted, "tau": st.tau,
                     "acceptance": st.accepted / st.drafted if st.drafted else None,
                     "sampled_in": st.sampled_in}  # graph: open_engine's --sample-in-graph auto on a GPU build
        rep.stage(tag, res)
    m = res["mtp"]
    res["speedup"] = m["tok_s"] / res["plain"]["tok_s"] if res["plain"]["tok_s"] else None
    res["acceptance_note"] = "random weights: the MTP block's drafts are almost never the trunk's token; ~0 is expected"
    log(f"{tag}: plain {res['plain']['tok_s']:.1f} tok/s, MTP {m['tok_s']:.1f} tok/s ({res['speedup']:.2f}x), "
        f"accepted {m['accepted']}/{m['drafted']} drafts (tau {m['tau']:.2f}; random weights: ~0 expected)")
    base, spec = runs["plain"][0], runs["mtp"][0]
    eq = res["greedy_equality"] = greedy_equality(plain.ctx, prompt, base, spec, on_host=True)
    if eq["first_divergence"] is not None:
        plain.reset()
    log(f"{tag}: greedy plain vs MTP: {eq}")
    rep.stage(tag, res)
    plain.close()
    mtp.close()
    target.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/device_check.json")
    ap.add_argument("--models-dir", default=None, help="where the random GGUFs go (default: next to --out)")
    ap.add_argument("--targets", default=DEFAULT_TARGETS, help=f"comma list of {', '.join(MODELS)} (default {DEFAULT_TARGETS})")
    ap.add_argument("--deadline", type=float, default=None, help="unix time to stop by (default: now + --budget-s)")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU: checks every stage in seconds")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--ar-tokens", type=int, default=128)
    ap.add_argument("--oracle-tokens", type=int, default=96)
    ap.add_argument("--eq-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    deadline = a.deadline or time.time() + a.budget_s
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    mdir = Path(a.models_dir) if a.models_dir else out.parent / "device-models"
    mdir.mkdir(parents=True, exist_ok=True)
    rep = Report(out, deadline)
    if a.cpu_dry_run:
        a.ngl, a.ctx, a.prompt, a.ar_tokens, a.oracle_tokens, a.eq_tokens, a.reps = 0, 512, 64, 24, 24, 24, 2
        a.threads = a.threads or 1
    else:
        a.ngl = -1
    import llama_cpp

    from localflash.llama.bindings import lib

    rep.data.update(
        script="benchmarks/device/device_check.py", argv=sys.argv[1:], started=time.strftime("%Y-%m-%dT%H:%M:%S"),
        cpu_dry_run=a.cpu_dry_run, python=platform.python_version(), llama_cpp_python=llama_cpp.__version__,
        gpu_offload=bool(lib().llama_supports_gpu_offload()), gpu=gpu_info() if not a.cpu_dry_run else {},
        weights="random: a 64 MiB random byte pool tiled through each quantized tensor, block scales set small; norms 1",
    )
    if not a.cpu_dry_run and not rep.data["gpu_offload"]:
        rep.skip("llama-cpp-python was built without GPU offload: the numbers below are CPU numbers")
    rep.save()
    pool = np.random.default_rng(7).integers(0, 256, size=64 << 20, dtype=np.uint8)
    models = TINY if a.cpu_dry_run else MODELS
    tags = [t.strip() for t in a.targets.split(",") if t.strip()]
    unknown = [t for t in tags if t not in models]
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}: choose from {', '.join(models)}")
    for i, tag in enumerate(tags):
        if rep.left() < 60:
            rep.skip(f"{tag}: not started (time)")
            continue
        tspec, dspec = models[tag]
        tpath = mdir / f"{tspec.name}-Q4_K_M.gguf"
        dpath = mdir / f"{dspec.name}-Q8_0.gguf" if dspec else None
        t0 = time.perf_counter()
        if not tpath.exists():
            write_random(tpath, tspec, "Q4_K_M", pool)
        if dpath and not dpath.exists():
            write_random(dpath, dspec, "Q8_0", pool, mask_token=3)
        sizes = f"{tpath.stat().st_size / 2**30:.2f}" + (f" + {dpath.stat().st_size / 2**30:.2f}" if dpath else "")
        log(f"{tag}: models ready in {time.perf_counter() - t0:.1f} s ({sizes} GiB)")
        rep.data.setdefault("write_s", {})[tag] = time.perf_counter() - t0

        try:
            if dpath is None:
                check_mtp(tag, tpath, rep, a)
            else:
                check_target(tag, tpath, dpath, rep, a)
        except Exception as e:  # keep what the other target can still measure
            rep.data.setdefault("errors", {})[tag] = f"{type(e).__name__}: {e}"
            rep.save()
            log(f"{tag}: FAILED: {type(e).__name__}: {e}")
        if not a.cpu_dry_run and os.environ.get("DEVICE_CHECK_KEEP_MODELS") != "1":
            later = [m for t in tags[i + 1:] for m in models[t] if m is not None]  # a file a later stage loads stays
            for spec, p in ((tspec, tpath), (dspec, dpath)):
                if p is not None and spec not in later:
                    p.unlink(missing_ok=True)
    if not a.cpu_dry_run and os.environ.get("DEVICE_CHECK_KEEP_MODELS") != "1":  # kept for a stage then skipped for time
        for t in tags:
            tspec, dspec = models[t]
            (mdir / f"{tspec.name}-Q4_K_M.gguf").unlink(missing_ok=True)
            if dspec:
                (mdir / f"{dspec.name}-Q8_0.gguf").unlink(missing_ok=True)
    rep.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    rep.save()
    log(f"wrote {out}")
    return 1 if rep.data.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
