"""Planned vs measured device memory for a loaded target, on a machine with NVIDIA GPUs (not a CI test).

    python benchmarks/device/vram_check.py MODEL.gguf [--ctx 8192] [--kv q8_0] [--vram 24GiB] [--tolerance 0.05]

Plans the target alone with ``localflash.plan`` on the detected GPUs, loads it
with exactly the planned model/context settings through llama.cpp's low-level
API, and while the model and context are alive asks NVML how much device memory
this process holds on each GPU. Prints both per GPU and llama.cpp's own buffer
report, and exits 1 if any GPU is off by more than the tolerance (default 5%).
Needs ``nvidia-ml-py`` and a CUDA build of llama-cpp-python. Tensor buffer
overrides (MoE experts on the host) are not applied by this script.
"""

from __future__ import annotations

import argparse
import os
import sys

from localflash.plan import devices
from localflash.formats.gguf_meta import read_meta
from localflash.llama.accounting import measure
from localflash.plan import Wishes, make_plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--kv", default=None)
    ap.add_argument("--vram", default=None, help="plan for this budget instead of the free memory")
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args(argv)

    gpus = devices.detect()
    if not gpus:
        print("no NVIDIA GPU visible through NVML (is nvidia-ml-py installed?)", file=sys.stderr)
        return 2
    before = devices.used_by_process(os.getpid())
    plan = make_plan(read_meta(args.model), None, devices.select_gpus(gpus, vram=args.vram), devices.host_memory(),
                     Wishes(ctx=args.ctx, kv=args.kv, n_draft=0))
    acc = measure(
        args.model, n_ctx=plan.n_ctx, n_batch=plan.n_batch, n_ubatch=plan.n_ubatch, type_k=plan.type_k,
        type_v=plan.type_v, flash_attn=plan.flash_attn, n_outputs_max=plan.n_outputs_max, n_rs_seq=plan.n_rs_seq,
        n_gpu_layers=plan.n_gpu_layers, split_mode=plan.split_mode, main_gpu=plan.main_gpu,
        tensor_split=plan.tensor_split, on_loaded=lambda: devices.used_by_process(os.getpid()),
    )
    measured = acc.probe or {}
    print(f"plan: n_ctx {plan.n_ctx}, KV {plan.type_k}, n_gpu_layers {plan.n_gpu_layers}, split {plan.split_mode}")
    print("llama.cpp buffers (MiB):", {k: {b: round(v / 2**20) for b, v in getattr(acc, k).items()}
                                      for k in ("model", "kv", "recurrent", "compute", "output")})
    worst = 0.0
    for row in plan.devices:
        got = measured.get(row.index, 0) - before.get(row.index, 0)
        err = (row.used - got) / got if got else float("inf")
        worst = max(worst, abs(err))
        print(f"GPU{row.index}: planned {row.used / 2**30:.2f} GiB, NVML {got / 2**30:.2f} GiB, error {err:+.1%}")
    ok = worst <= args.tolerance
    print("OK" if ok else f"FAIL: off by more than {args.tolerance:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
