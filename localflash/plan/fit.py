"""VRAM planner: price a target + drafter pair before loading it, and pick settings that fit.

Everything here is arithmetic on GGUF metadata (``localflash.formats.gguf_meta``); no GPU
is touched. The cost model (``localflash.plan.costs``, priced per device by
``localflash.plan.pricer``) follows the vendored llama.cpp (0.3.36).

``make_plan`` searches, in this priority order: all target layers on the GPU
(one card when everything fits on one, else a layer split balanced by bytes),
context ≥ the wish, KV cache f16 → q8_0 → q4_0, then MoE experts on the host,
then partial layer offload (with the expected decode slowdown), and otherwise
refuses, naming the minimum and what would fit.
"""

from __future__ import annotations

from dataclasses import replace

from localflash.archs import DSPARK_DSV4_REFUSAL

QUANT_BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "iq4_nl": 32}  # values per block of a KV cache type
from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import ModelMeta
from localflash.plan.costs import (
    EXPERT_PATTERN,
    GGML_TYPE_IDS,
    KV_ORDER,
    SPLIT_MODES,
    decode_slowdown,
    kv_bytes_per_layer,
    pad_ctx,
)
from localflash.plan.devices import Gpu, HostMemory, format_size
from localflash.plan.mtp import mtp_kv_bytes, mtp_weight_bytes
from localflash.plan.pricer import Config, Placement, Pricer
from localflash.plan.remote import OUTPUT_PATTERN, traffic_per_pass
from localflash.plan.types import DEFAULT_CTX, Change, Plan, Wishes


def make_plan(
    target: ModelMeta,
    drafter: ModelMeta | None,
    gpus: list[Gpu],
    host: HostMemory,
    wishes: Wishes | None = None,
) -> Plan:
    """The best feasible plan in the stated priority order, or a ``LocalflashError`` naming what would fit."""
    w = wishes or Wishes()
    _check_wishes(target, drafter, w)
    pr = Pricer(target, drafter, gpus, host, w)
    kvs = [w.kv] if w.kv else list(KV_ORDER)
    if w.split == "tensor":
        kvs = [k for k in kvs if k in ("f16", "bf16", "f32")]
    asked = w.ctx is not None and w.ctx > 0
    want = w.ctx if asked else (DEFAULT_CTX if w.ctx is None else target.n_ctx_train or DEFAULT_CTX)
    want = min(want, target.n_ctx_train) if target.n_ctx_train and not asked else want
    changes: list[Change] = []

    full = [list(_full_placements(pr, w))]
    found = _first_fit(pr, full, want, kvs)
    if found is None and not asked:
        found = _largest_fit(pr, full[0], kvs, want, w.min_ctx)
        if found is not None:
            changes.append(Change("n_ctx", found.n_ctx, f"{want} does not fit with every layer on the GPU"))
    if found is None and target.is_moe and gpus:
        found = _first_fit(pr, list(_expert_placements(pr, w)), want, kvs)
    if found is None and gpus:
        found = _first_fit(pr, list(_offload_placements(pr, w)), want, kvs)
    if found is None:
        raise _refusal(pr, w, want if asked else min(want, w.min_ctx), want, kvs)
    if w.ctx == 0:
        found = replace(found, n_ctx=_largest_ctx(pr, found.placement, found.kv, target.n_ctx_train or want))
    return _build(pr, found, want, kvs, changes)


def _check_wishes(target: ModelMeta, drafter: ModelMeta | None, w: Wishes) -> None:
    if target.is_dflash:
        raise LocalflashError(
            f"{target.path.name} is a DFlash drafter, not a target: it drafts for a model and cannot run alone",
            hint=f"pass it with --drafter next to its target: -m TARGET.gguf --drafter {target.path}",
        )
    if w.kv and w.kv not in GGML_TYPE_IDS:
        raise LocalflashError(f"unknown KV cache type {w.kv!r}", hint=f"choose one of {', '.join(KV_ORDER)}")
    if w.drafter_kv and w.drafter_kv not in GGML_TYPE_IDS:
        raise LocalflashError(f"unknown drafter KV cache type {w.drafter_kv!r} (--kv-drafter)", hint=f"choose one of {', '.join(KV_ORDER)}")
    if w.split not in ("layer", "tensor"):
        hint = "row split does not work on CUDA in this llama.cpp" if w.split == "row" else None
        raise LocalflashError(f"unsupported split mode {w.split!r}", hint=hint or "use layer (default) or tensor")
    if w.split == "tensor" and w.kv and w.kv not in ("f16", "bf16", "f32"):
        raise LocalflashError("tensor split needs an f16/bf16/f32 KV cache", hint="drop --kv or use --kv f16")
    if drafter is not None and drafter.is_dflash and not drafter.selector_top_k and any(
        t.name == "selector_hidden.weight" for t in drafter.tensors
    ):
        raise LocalflashError(
            f"{drafter.path.name} is a DFlash2 drafter without its conv/selector metadata (dflash.selector_top_k etc.)",
            hint="convert it again with a converter that writes the DFlash2 keys (localflash convert-drafter does)",
        )
    for meta, kv, flag in ((target, w.kv, "--kv"), (drafter, w.drafter_kv, "--kv-drafter")):
        block = QUANT_BLOCK.get(kv or "f16", 1)
        if meta is not None and block > 1 and (meta.head_dim_k % block or meta.head_dim_v % block):
            raise LocalflashError(f"a {kv} KV cache stores heads in blocks of {block} values but {meta.path.name}'s heads are "
                                  f"{meta.head_dim_k} wide", hint=f"use {flag} f16 for this model")
    if drafter is not None and drafter.is_dflash and drafter.dsv4_backbone:
        raise LocalflashError(DSPARK_DSV4_REFUSAL.format(name=drafter.path.name),
                              hint="use a DSpark drafter with a Qwen3-style (DFlash) backbone")
    if drafter is not None and drafter.is_eagle3 and drafter.target_hidden_size != target.n_embd:
        raise LocalflashError(
            f"EAGLE-3 drafter expects target_hidden_size {drafter.target_hidden_size} but the target is {target.n_embd} wide",
            hint="pair it with the target it was trained for",
        )
    if drafter is not None and drafter.is_dflash and not drafter.has_own_head and drafter.n_embd != target.n_embd:
        raise LocalflashError(
            f"drafter width {drafter.n_embd} differs from the target's {target.n_embd}",
            hint="a DFlash drafter borrows the target's embedding and head: pair it with the target it was trained for",
        )


def _full_placements(pr: Pricer, w: Wishes):
    n_slots = pr.t.n_layer_all + 1
    if not pr.gpus:
        yield Placement((), (), 0)
        return
    if any(g.endpoint for g in pr.gpus):  # remote devices (first, as llama.cpp orders them) and local cards: one layer split
        yield Placement(tuple(range(len(pr.gpus))), (), n_slots, host_output=pr.gpus[-1].endpoint is not None)
        return
    if w.split == "tensor" and len(pr.gpus) > 1:
        yield Placement(tuple(range(len(pr.gpus))), tuple(g.free for g in pr.gpus), n_slots, split_mode="tensor")
        return
    for g in sorted(range(len(pr.gpus)), key=lambda i: -pr.gpus[i].free):
        yield Placement((g,), (n_slots,), n_slots, split_mode="none")
    if len(pr.gpus) > 1:
        yield Placement(tuple(range(len(pr.gpus))), (), n_slots)  # slots balanced per candidate


def _expert_placements(pr: Pricer, w: Wishes):
    """Groups of placements with the experts of the first m blocks on the host, m = 1, 2, ..."""
    for m in range(1, pr.t.n_layer + 1):
        yield [replace(p, host_expert_layers=m) for p in _full_placements(pr, w)]


def _offload_placements(pr: Pricer, w: Wishes):
    """Groups of placements with one block fewer on the GPU each time."""
    n_slots = pr.t.n_layer_all + 1
    for ngl in range(n_slots - 1, 0, -1):
        yield [replace(p, n_gpu_layers=ngl, slots=(ngl,) if len(p.gpus) == 1 else ())
               for p in _full_placements(pr, w) if p.split_mode != "tensor"]


def _first_fit(pr: Pricer, groups: list[list[Placement]], n_ctx: int, kvs: list[str]) -> Config | None:
    """First feasible config: groups in priority order; within a group the KV type outranks the placement
    (an f16 cache over two cards beats a q4_0 cache on one)."""
    for group in groups:
        for kv in kvs:
            for p in group:
                c = _balanced(pr, Config(n_ctx, kv, p))
                if c is not None and pr.fits(c):
                    return c
    return None


def _balanced(pr: Pricer, c: Config) -> Config | None:
    """Fill in a layer split whose per-card headroom is as even as bytes allow (llama.cpp splits by slot count)."""
    p = c.placement
    if p.slots or not p.gpus:
        return c
    n = p.n_gpu_layers
    k = len(p.gpus)
    best, best_room = None, None
    if k == 2:
        candidates = [(a, n - a) for a in range(1, n)]
    else:
        base = [n // k + (1 if i < n % k else 0) for i in range(k)]
        candidates = [tuple(base)]
        for i in range(k):
            for j in range(k):
                for step in range(1, n // k):
                    s = list(base)
                    s[i] += step
                    s[j] -= step
                    if i != j and s[j] > 0:
                        candidates.append(tuple(s))
    for slots in candidates:
        cand = replace(c, placement=replace(p, slots=slots))
        rows, host = pr.price(cand)
        room = (min([r.free for r in rows] + [host.free]), min(r.free for r in rows))  # ties (the host binds): even cards
        if best_room is None or room > best_room:
            best, best_room = cand, room
    return best


def _largest_fit(pr: Pricer, placements: list[Placement], kvs: list[str], want: int, floor: int) -> Config | None:
    """The largest context (at least ``floor``) any placement fits; ties go to the earlier placement and KV type."""
    best = None
    for p in placements:
        for kv in kvs:
            n = _largest_ctx(pr, p, kv, want)
            if n >= floor and (best is None or n > best.n_ctx):
                best = _balanced(pr, Config(n, kv, p))
    return best


def _largest_ctx(pr: Pricer, p: Placement, kv: str, limit: int) -> int:
    """Largest context (multiple of 256, at most ``limit``) that fits with this placement and KV type; 0 if none."""
    def ok(n: int) -> bool:
        c = _balanced(pr, Config(n, kv, p))
        return c is not None and pr.fits(c)

    lo, hi = 0, pad_ctx(limit) // 256
    if not ok(256):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid * 256):
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def context_for_total(target: ModelMeta, drafter: ModelMeta | None, total: int, kv: str, wishes: Wishes | None = None) -> int:
    """Largest context whose single-card total (everything priced on the GPU, overhead included) stays within ``total``."""
    w = replace(wishes or Wishes(), margin=0)
    gpu = Gpu(0, "GPU", total, total)
    pr = Pricer(target, drafter, [gpu], HostMemory(1 << 50, 1 << 50), w)
    n_slots = target.n_layer_all + 1
    return _largest_ctx(pr, Placement((0,), (n_slots,), n_slots, split_mode="none"), kv, target.n_ctx_train or 1 << 20)


def _refusal(pr: Pricer, w: Wishes, least: int, want: int, kvs: list[str]) -> LocalflashError:
    """Say what the smallest configuration (at context ``least``) needs, and what would fit instead."""
    t = pr.t
    n_slots = t.n_layer_all + 1
    kv = kvs[-1]
    if pr.gpus:
        g = max(range(len(pr.gpus)), key=lambda i: pr.gpus[i].free)
        rows, host = pr.price(Config(least, kv, Placement((g,), (1,), 1, split_mode="none")))
        gpu = pr.gpus[g]
        smallest = (f"the smallest configuration (only the output layer on GPU{gpu.index}, {kv} KV, {least} context) "
                    f"needs {format_size(rows[0].used + w.margin)} on the card (it has {format_size(gpu.free)}) "
                    f"and {format_size(host.used + w.margin)} of host RAM ({format_size(pr.host.available)} available)")
        all_rows, _ = pr.price(Config(least, kv, Placement((g,), (n_slots,), n_slots, split_mode="none")))
        smallest += f"; every layer on one card needs {format_size(all_rows[0].used + w.margin)}"
    else:
        rows, host = pr.price(Config(least, kv, Placement((), (), 0)))
        smallest = (f"with a {kv} KV cache and {least} context it needs {format_size(host.used + w.margin)} of host RAM "
                    f"({format_size(pr.host.available)} available)")
    trained = t.n_ctx_train
    options = []
    for p in _full_placements(pr, w):
        for k in kvs:
            n = _largest_ctx(pr, p, k, min(want, trained) if trained else want)  # never offer more than it was trained on
            if n:
                options.append((n, -kvs.index(k), k))
    if options:
        n, _, k = max(options)
        hint = f"largest context that fits: {n} with {k} KV (--ctx {n} --kv {k})"
        if n == trained:
            hint = f"largest context that fits: {n} with {k} KV (--ctx {n} --kv {k}), all the model was trained on"
    else:
        hint = "no context fits with every layer on the GPU: use a smaller quant, a smaller drafter or more memory"
    if trained and want > trained:
        hint += f"; more than its trained {trained} tokens needs RoPE scaling (localflash does not set it up)"
    return LocalflashError(f"{t.name} does not fit: {smallest}", hint=hint)


def _build(pr: Pricer, c: Config, want: int, kvs: list[str], changes: list[Change]) -> Plan:
    t, d, w, p = pr.t, pr.d, pr.w, c.placement
    rows, host = pr.price(c)
    where = pr.slot_devices(p)
    for g, row in enumerate(rows):
        blocks = [il for il in range(t.n_layer) if where[il] == g]
        row.layers = (f"{blocks[0]}-{blocks[-1]}" if blocks else "") + (", output" if where[t.n_layer_all] == g else "")
        if p.split_mode == "tensor":
            row.layers = f"share {p.slots[g] / sum(p.slots):.2f} of every block"
    host_blocks = [il for il in range(t.n_layer) if where[il] is None]
    host.layers = "token embedding" + (f", blocks {host_blocks[0]}-{host_blocks[-1]}" if host_blocks else "")
    if p.host_expert_layers:
        host.layers += f", experts of blocks 0-{p.host_expert_layers - 1}"

    kv_default = w.kv or "f16"
    if c.kv != kv_default:
        f16_need = pr.headroom(replace(c, kv=kv_default))
        changes.append(Change("type_k/type_v", c.kv, f"an {kv_default} KV cache would be {format_size(-f16_need)} over budget"))
    if p.gpus and len(pr.gpus) > 1 and len(p.gpus) == 1 and p.n_gpu_layers == t.n_layer_all + 1:
        changes.append(Change("split_mode", "none", f"everything fits on GPU{pr.gpus[p.gpus[0]].index}: at batch 1 a "
                              "layer split over PCIe decodes no faster than one card"))
    if len(p.gpus) > 1 and p.split_mode == "layer":
        changes.append(Change("tensor_split", list(p.slots), "block slots per card chosen by bytes so every card keeps "
                              "the same headroom (the last card also holds the output layer and the drafter)"))
    gpu_bytes = sum(r.target_weights for r in rows)
    host_bytes = sum(t.layer_bytes[il] for il in host_blocks)
    active = t.n_expert_used / t.n_expert if t.is_moe else 1.0
    expert_host = sum(t.expert_bytes[:p.host_expert_layers])
    slowdown = 1.0 if not p.gpus else decode_slowdown(gpu_bytes - (1 - active) * sum(t.expert_bytes[p.host_expert_layers:]),
                               host_bytes + expert_host * active)
    overrides: list[tuple[str, str]] = []
    if p.host_expert_layers:
        pattern = EXPERT_PATTERN if p.host_expert_layers >= t.n_layer else (
            rf"^blk\.({'|'.join(str(i) for i in range(p.host_expert_layers))})\.{EXPERT_PATTERN}")
        overrides.append((pattern, "CPU"))
        changes.append(Change("tensor_buft_overrides", pattern, f"experts of {p.host_expert_layers} blocks "
                              f"({format_size(expert_host)}) stay in host RAM; expected decode ≈{slowdown:.1f}× slower"))
    if pr.gpus and p.n_gpu_layers < t.n_layer_all + 1:
        changes.append(Change("n_gpu_layers", p.n_gpu_layers, f"{len(host_blocks)} blocks "
                              f"({format_size(host_bytes)}) run from host RAM; expected decode ≈{slowdown:.1f}× slower"))
    d_ctx = pr.drafter_ctx(c.n_ctx)
    n_seq = max(1, w.n_seq)
    if d is not None and d_ctx < (c.n_ctx if n_seq == 1 else pad_ctx(c.n_ctx) // n_seq):  # slots: the cap binds below a share
        full = sum(kv_bytes_per_layer(d, c.n_ctx, c.kv, w.n_ubatch).values())
        capped = sum(kv_bytes_per_layer(d, d_ctx, c.kv, w.n_ubatch).values())
        changes.append(Change("drafter_n_ctx", d_ctx, f"inheriting {c.n_ctx} (llama.cpp's default) would cost "
                              f"{format_size(full - capped)} more; drafting stops past {d_ctx} tokens"))
    if pr.mtp:
        changes.append(Change("load_mtp", True, f"MTP drafting: the nextn block ({format_size(mtp_weight_bytes(t))}) "
                              f"and the MTP context's KV cache ({format_size(mtp_kv_bytes(t, c.n_ctx, c.kv, w.n_ubatch))})"
                              " are in the drafter column"))
    if pr.n_rs_seq:
        changes.append(Change("n_rs_seq", pr.n_rs_seq, "hybrid target: keep recurrent-state snapshots so a rejected "
                              f"draft of up to {w.n_draft} tokens can be rolled back"))
    remote = [pr.gpus[g] for g in p.gpus if pr.gpus[g].endpoint]
    if remote and p.host_output:
        overrides.append((OUTPUT_PATTERN, "CPU"))
        changes.append(Change("tensor_buft_overrides", OUTPUT_PATTERN, "the output layer stays on this machine "
                              "(with the drafter): logits never cross the network"))
    options = {kv: _largest_ctx(pr, p, kv, t.n_ctx_train or c.n_ctx) for kv in kvs}
    out_dev = where[t.n_layer_all]
    split_mode = p.split_mode if len(p.gpus) > 1 else "none"
    warnings = list(t.warnings) + (list(d.warnings) if d else [])
    if t.n_ctx_train and c.n_ctx > t.n_ctx_train:
        warnings.append(f"context {c.n_ctx} is beyond the {t.n_ctx_train} tokens {t.name} was trained on: "
                        "without RoPE scaling it writes poorly past that")
    if split_mode == "tensor":
        warnings.append("tensor split is experimental: it needs flash attention, an f16 KV cache and an NCCL build")
    return Plan(
        target=str(t.path),
        drafter=str(d.path) if d else None,
        devices=rows,
        host=host,
        n_ctx=pad_ctx(c.n_ctx),
        type_k=c.kv,
        type_v=c.kv,
        n_batch=w.n_batch,
        n_ubatch=w.n_ubatch,
        n_outputs_max=pr.n_outputs,
        n_rs_seq=pr.n_rs_seq,
        flash_attn=True,
        n_gpu_layers=p.n_gpu_layers,
        split_mode=split_mode,
        main_gpu=pr.gpus[p.gpus[0]].index if p.gpus and not remote else 0,
        tensor_split=[float(s) for s in p.slots] if remote else _split_by_device(pr, p) if len(p.gpus) > 1 else None,
        tensor_overrides=overrides,
        drafter_device=pr.gpus[p.gpus[out_dev]].index if (d is not None and out_dev is not None and p.gpus) else None,
        drafter_n_ctx=pad_ctx(d_ctx) if d is not None else 0,
        drafter_slots=_drafter_slots(pr, c.n_ctx) if n_seq > 1 and (d is not None or pr.mtp) else None,
        drafter_type_kv=pr.drafter_kv(c) if d is not None else "",
        drafter_n_gpu_layers=(d.n_layer_all + 1) if (d is not None and out_dev is not None and p.gpus) else 0,
        slowdown=round(slowdown, 2),
        context_options=options,
        changes=changes,
        warnings=warnings,
        mtp=pr.mtp,
        device_keys=[pr.gpus[g].key for g in p.gpus] if remote else None,
        traffic=traffic_per_pass(t, where, [pr.gpus[g].endpoint for g in p.gpus], pr.n_outputs, c.n_ctx,
                                 d.target_layers if d is not None and (d.is_dflash or d.is_eagle3) else ()) if remote else None,
    )


def _split_by_device(pr: Pricer, p: Placement) -> list[float]:
    """``tensor_split`` as llama.cpp reads it: one entry per device index, 0 for cards the plan leaves out."""
    out = [0.0] * (max(pr.gpus[g].index for g in p.gpus) + 1)
    total = sum(p.slots)
    for g, slots in zip(p.gpus, p.slots):
        out[pr.gpus[g].index] = float(slots) if p.split_mode == "layer" else round(slots / total, 4)
    return out


def _drafter_slots(pr, n_ctx: int) -> dict:
    """How the drafter's contexts are laid out for parallel slots (Plan.drafter_slots): what the plan priced."""
    if pr.d is None:  # MTP: one context on the target model, a sequence a slot
        n = max(1, pr.w.n_seq)
        return {"contexts": 1, "seqs": n, "positions": pr.mtp_cells(n_ctx) // n}
    lay = pr.drafter_layout(n_ctx)
    return {"contexts": lay.contexts, "seqs": lay.seqs, "positions": lay.positions}


def runtime_kwargs(plan: Plan) -> dict:
    """The settings the runtime passes to llama.cpp, as one dict.

    Target model params: ``devices`` (None: llama.cpp's default list; with remote devices the devices'
    keys, ``rpc:HOST:PORT#i`` / ``gpu:N``, in order, ``tensor_split`` indexed by position there), ``n_gpu_layers`` (int), ``split_mode`` (llama_split_mode int: 0 none, 1 layer,
    3 tensor), ``main_gpu`` (int), ``tensor_split`` (None, or floats indexed by CUDA device: block slots
    per card, 0 for unused cards; llama.cpp normalises them),
    ``tensor_buft_overrides`` (list of ``(regex, "CPU")``). Target context params: ``n_ctx``, ``n_batch``,
    ``n_ubatch``, ``n_outputs_max``, ``n_rs_seq`` (ints), ``type_k``/``type_v`` (ggml_type ints),
    ``flash_attn`` (bool; always True), ``load_mtp`` (bool: load the nextn block for MTP drafting). Drafter: ``drafter_n_ctx`` (int, 0 without a drafter) and
    ``drafter`` — None, or a dict with ``n_gpu_layers``, ``split_mode`` (always 0: the drafter lives on
    one device), ``main_gpu``, ``n_ctx``, ``type_k``, ``type_v``.
    """
    kw = {
        "n_gpu_layers": plan.n_gpu_layers,
        "split_mode": SPLIT_MODES[plan.split_mode],
        "main_gpu": plan.main_gpu,
        "tensor_split": plan.tensor_split,
        "tensor_buft_overrides": [tuple(o) for o in plan.tensor_overrides],
        "n_ctx": plan.n_ctx,
        "n_batch": plan.n_batch,
        "n_ubatch": plan.n_ubatch,
        "n_outputs_max": plan.n_outputs_max,
        "n_rs_seq": plan.n_rs_seq,
        "type_k": GGML_TYPE_IDS[plan.type_k],
        "type_v": GGML_TYPE_IDS[plan.type_v],
        "flash_attn": plan.flash_attn,
        "drafter_n_ctx": plan.drafter_n_ctx,
        "drafter": None,
        "load_mtp": plan.mtp,
        "devices": plan.device_keys,
    }
    if plan.drafter:
        kw["drafter"] = {
            "n_gpu_layers": plan.drafter_n_gpu_layers,
            "split_mode": SPLIT_MODES["none"],
            "main_gpu": plan.drafter_device if plan.drafter_device is not None else 0,
            "n_ctx": plan.drafter_n_ctx,
            "type_k": GGML_TYPE_IDS[plan.drafter_type_kv],
            "type_v": GGML_TYPE_IDS[plan.drafter_type_kv],
        }
    return kw
