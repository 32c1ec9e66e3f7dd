"""VRAM planner: price a target + drafter pair before loading it, and pick settings that fit.

Everything here is arithmetic on GGUF metadata (``localflash.formats.gguf_meta``); no GPU
is touched. The cost model follows the vendored llama.cpp (0.3.36):

- **weights** per device by llama.cpp's placement rule: the token embedding stays
  on the host, block ``i`` goes to the first GPU whose cumulative ``tensor_split``
  share exceeds ``(i - i_gpu_start) / act_gpu_layers``, and the output layer
  counts as block ``n_layer_all`` (so it lands on the last GPU). A tied LM head is
  loaded a second time there. Expert tensors named by a buffer override stay on
  the host;
- **KV cache** per block: ``round_up(n_ctx, 256)`` cells (sliding-window blocks:
  ``round_up(min(n_ctx, window + n_ubatch), 256)``) times the K and V row sizes of
  the cache type; hybrid models add ``(1 + n_rs_seq)`` f32 recurrent-state rows
  per recurrent block;
- **compute buffers**: a stage model of ggml's graph allocator at ``n_ubatch``
  tokens, checked against llama.cpp's own reports (``tests/plan/test_plan.py``): an
  FFN stage ``mask + 3·n_ff·T·4 + 4·n_embd·T·4``, an attention stage (without
  flash attention the ``n_kv × T × n_head`` score matrix; with it on CUDA and a
  quantized cache, the f16 copies of K and V), a MoE stage, and the output stage
  ``n_vocab × n_outputs × 4``; the largest wins;
- the drafter's weights, its own (capped) KV cache and compute buffer, on the
  card that holds the target's output layer; for MTP drafting (``Wishes.mtp``)
  the target's own nextn block, the MTP context's KV cache at the full context
  and its one-block compute buffer (``localflash.plan.mtp``); a fixed **runtime overhead** per GPU
  (CUDA context, cuBLAS workspace, memory pool) and a **safety margin** left free.

``make_plan`` searches, in this priority order: all target layers on the GPU
(one card when everything fits on one, else a layer split balanced by bytes),
context ≥ the wish, KV cache f16 → q8_0 → q4_0, then MoE experts on the host,
then partial layer offload (with the expected decode slowdown), and otherwise
refuses, naming the minimum and what would fit.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace

from localflash.plan.devices import Gpu, HostMemory, format_size
from localflash.archs import EAGLE3_ENCODE_ROWS, GATED_QUERY_ARCHS
from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import ModelMeta, tensor_bytes

MiB = 1024**2
GiB = 1024**3

KV_ORDER = ("f16", "q8_0", "q4_0")
GGML_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
SPLIT_MODES = {"none": 0, "layer": 1, "tensor": 3}  # llama_split_mode; "row" does not work on CUDA in 0.3.36

# decode reads every weight once per token: what a layer on the host costs against one on the GPU
GPU_BANDWIDTH = 936e9  # RTX 3090-class GDDR6X
HOST_BANDWIDTH = 60e9  # dual-channel DDR5
EXPERT_PATTERN = r"ffn_(up|down|gate|gate_up)_exps"
PIPELINE_COPIES = 4  # GGML_SCHED_MAX_COPIES


@dataclass
class Wishes:
    """What the user asked for; ``None`` means "choose for me"."""

    ctx: int | None = None  # None: DEFAULT_CTX (capped at the training context); 0: the largest that fits
    kv: str | None = None  # None: f16, then q8_0, then q4_0 as needed
    n_draft: int = 8  # longest draft verified in one batch
    n_rs_seq: int | None = None  # recurrent-state snapshots of a hybrid target; None: n_draft (rollback of a full draft)
    mtp: bool = False  # draft with the target's own MTP block (load_mtp, an MTP context); ignored without nextn layers
    n_batch: int = 512
    n_ubatch: int = 512
    drafter_ctx_cap: int | None = 32768  # None: inherit the target's context, as llama.cpp does
    drafter_kv: str | None = None  # None: whichever of f16 and the target's type costs less
    split: str = "layer"  # "layer", or "tensor" (experimental; only when asked)
    margin: int = 512 * MiB  # left free on every GPU (desktop, fragmentation)
    overhead: int = 512 * MiB  # CUDA context, cuBLAS workspace, memory pool per GPU
    min_ctx: int = 4096


DEFAULT_CTX = 32768


@dataclass
class DeviceUse:
    """One row of the plan table: what lands on one GPU (or on the host)."""

    name: str
    index: int | None  # GPU index; None for the host
    budget: int  # what the plan may use (free memory minus the margin)
    layers: str = ""
    target_weights: int = 0
    target_kv: int = 0  # KV cache plus recurrent state
    target_compute: int = 0
    drafter_weights: int = 0
    drafter_kv: int = 0
    drafter_compute: int = 0
    overhead: int = 0  # runtime overhead (GPU) or output buffers (host)

    @property
    def used(self) -> int:
        return (self.target_weights + self.target_kv + self.target_compute + self.drafter_weights
                + self.drafter_kv + self.drafter_compute + self.overhead)

    @property
    def free(self) -> int:
        return self.budget - self.used


@dataclass
class Change:
    """A setting the planner chose differently from the wish or llama.cpp's default, and why."""

    setting: str
    value: object
    reason: str


@dataclass
class Plan:
    target: str
    drafter: str | None
    devices: list[DeviceUse]
    host: DeviceUse
    n_ctx: int
    type_k: str
    type_v: str
    n_batch: int
    n_ubatch: int
    n_outputs_max: int
    n_rs_seq: int
    flash_attn: bool
    n_gpu_layers: int
    split_mode: str
    main_gpu: int
    tensor_split: list[float] | None
    tensor_overrides: list[tuple[str, str]]
    drafter_device: int | None  # GPU index, or None for the host
    drafter_type_kv: str
    drafter_n_ctx: int
    drafter_n_gpu_layers: int
    slowdown: float  # expected decode time / decode time with everything on the GPU
    context_options: dict[str, int]  # largest context that fits with this placement, per KV type
    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mtp: bool = False  # the target's MTP block is loaded and its context priced (drafter column)

    @property
    def gpu_total(self) -> int:
        return sum(d.used for d in self.devices)

    def to_json(self) -> str:
        d = asdict(self)
        for row in [*d["devices"], d["host"]]:
            row["used"] = DeviceUse(**row).used
        return json.dumps(d, indent=2)


# --- cost model -------------------------------------------------------------


def pad_ctx(n_ctx: int) -> int:
    return -(-n_ctx // 256) * 256


def kv_row_bytes(kv: str, n: int) -> int:
    return tensor_bytes(kv, (n,))


def kv_bytes_per_layer(meta: ModelMeta, n_ctx: int, kv: str, n_ubatch: int, kv_v: str | None = None) -> dict[int, int]:
    """KV cache bytes of each block that has one, for a context of ``n_ctx`` tokens."""
    kv_v = kv_v or kv
    cells = pad_ctx(n_ctx)
    swa_cells = min(cells, pad_ctx(meta.swa_window + n_ubatch)) if meta.swa_window else cells
    out = {}
    for layer in meta.kv_layers():
        n = swa_cells if layer.swa else cells
        out[layer.index] = n * (kv_row_bytes(kv, layer.n_embd_k) + kv_row_bytes(kv_v, layer.n_embd_v))
    return out


def recurrent_bytes_per_layer(meta: ModelMeta, n_rs_seq: int, n_seq: int = 1) -> dict[int, int]:
    if meta.ssm is None:
        return {}
    rows = max(1, n_seq) * (1 + n_rs_seq)
    return {il: rows * 4 * meta.ssm.row_floats for il in range(meta.n_layer) if meta.recurrent_layers[il]}


def compute_bytes(
    meta: ModelMeta,
    layers: list[int],
    output: bool,
    *,
    n_ctx: int,
    n_ubatch: int,
    n_outputs: int,
    kv: str,
    flash_attn: bool = True,
    cuda: bool = False,
    copies: int = 1,
) -> int:
    """Compute buffer of one backend that runs ``layers`` (block indices) and, if ``output``, the LM head.

    ``copies`` > 1 models pipeline parallelism (llama.cpp turns it on for a full-offload layer split over
    several GPUs): the scheduler keeps that many pinned copies of every graph input and split input."""
    T = min(pad_ctx(n_ctx), n_ubatch)
    E = meta.n_embd
    ET = E * T * 4
    n_out = max(1, min(T, n_outputs))
    small = T * 32
    kv_by_index = {lay.index: lay for lay in meta.kv_layers()}
    cells = pad_ctx(n_ctx)
    swa_cells = min(cells, pad_ctx(meta.swa_window + n_ubatch)) if meta.swa_window else cells
    mask_el = 2 if flash_attn else 4

    attn = [kv_by_index[i] for i in layers if i in kv_by_index]
    mask = 0
    if any(not a.swa for a in attn):
        mask += cells * T * mask_el
    if any(a.swa for a in attn):
        mask += swa_cells * T * mask_el
    stage = 0
    for a in attn:
        n_kv = swa_cells if a.swa else cells
        q_mult = 2 if meta.arch in GATED_QUERY_ARCHS else 1  # query and output gate share one projection
        n_head = meta.n_head[a.index]
        q = q_mult * n_head * meta.head_dim_k * T * 4
        kv_act = (a.n_embd_k + a.n_embd_v) * T * 4
        if flash_attn:
            s = q + kv_act + n_head * meta.head_dim_v * T * 4 + 4 * ET
            if cuda and kv != "f16":
                s += n_kv * (a.n_embd_k + a.n_embd_v) * 2  # f16 copies of K and V for the batched kernels
        else:
            s = n_kv * T * n_head * 4 + q + kv_act + 5 * ET
        stage = max(stage, s)
    if any(i < meta.n_layer for i in layers):
        if meta.is_moe:
            k, fe, x = meta.n_expert_used, meta.n_ff_exp, meta.n_expert
            stage = max(stage, 3 * T * k * fe * 4 + T * k * E * 4 + 5 * ET + 3 * T * x * 4)
        if meta.n_ff:
            stage = max(stage, 3 * meta.n_ff * T * 4 + 4 * ET)
        if meta.is_dflash or meta.is_eagle3:
            stage = max(stage, 2 * meta.n_embd_inp * T * 4 + ET)  # fc over the concatenated target features
    out_stage = 0
    if output:
        out_stage = meta.output_vocab * n_out * 4 + ET + 2 * E * n_out * 4
    layer_part = copies * mask + stage if (attn or stage) else 0
    if copies > 1:
        layer_part += copies * ET  # the activation arriving from the previous card
    return max(layer_part, out_stage) + copies * small


def decode_slowdown(gpu_bytes: float, host_bytes: float) -> float:
    """Per-token decode time with ``host_bytes`` read from RAM, relative to all of it in VRAM."""
    total = gpu_bytes + host_bytes
    if total <= 0 or host_bytes <= 0:
        return 1.0
    return (gpu_bytes / GPU_BANDWIDTH + host_bytes / HOST_BANDWIDTH) / (total / GPU_BANDWIDTH)


@dataclass(frozen=True)
class Placement:
    """Where the target's blocks go: ``slots[g]`` block slots on GPU ``gpus[g]`` (output slot included)."""

    gpus: tuple[int, ...]  # indices into the planner's GPU list
    slots: tuple[int, ...]
    n_gpu_layers: int
    host_expert_layers: int = 0  # experts of blocks 0..n-1 stay on the host
    split_mode: str = "layer"


@dataclass(frozen=True)
class Config:
    n_ctx: int
    kv: str
    placement: Placement


class Pricer:
    """Prices a target (+ drafter) for one ``Config`` on a list of GPUs and the host."""

    def __init__(self, target: ModelMeta, drafter: ModelMeta | None, gpus: list[Gpu], host: HostMemory, wishes: Wishes):
        self.mtp = wishes.mtp and target.n_layer_nextn > 0 and drafter is None
        if self.mtp:
            target = replace(target, load_mtp=True)
        self.t, self.d, self.gpus, self.host, self.w = target, drafter, gpus, host, wishes
        rs = wishes.n_draft if wishes.n_rs_seq is None else wishes.n_rs_seq
        self.n_rs_seq = rs if target.is_hybrid else 0
        self.n_outputs = wishes.n_draft + 1
        self.layer_bytes = target.layer_bytes
        self.expert_bytes = target.expert_bytes
        self.rs = recurrent_bytes_per_layer(target, self.n_rs_seq)
        self.biggest_matmul = [0] * target.n_layer_all  # per block: largest 2-D/3-D weight, and largest expert weight
        self.biggest_expert = [0] * target.n_layer_all
        for tensor in target.tensors:
            if len(tensor.shape) >= 2 and tensor.layer is not None and target.loaded(tensor):
                il = tensor.layer
                self.biggest_matmul[il] = max(self.biggest_matmul[il], tensor.n_bytes)
                if re.search(EXPERT_PATTERN, tensor.name):
                    self.biggest_expert[il] = max(self.biggest_expert[il], tensor.n_bytes)
        self._memo: dict = {}

    def _cached(self, key, fn):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def kv(self, meta: ModelMeta, n_ctx: int, kv: str) -> dict[int, int]:
        return self._cached(("kv", id(meta), n_ctx, kv), lambda: kv_bytes_per_layer(meta, n_ctx, kv, self.w.n_ubatch))

    def compute(self, meta: ModelMeta, layers: list[int], output: bool, n_ctx: int, kv: str, cuda: bool,
                n_outputs: int, copies: int = 1) -> int:
        key = ("compute", id(meta), tuple(layers), output, n_ctx, kv, cuda, n_outputs, copies)
        return self._cached(key, lambda: compute_bytes(meta, layers, output, n_ctx=n_ctx, n_ubatch=self.w.n_ubatch,
                                                       n_outputs=n_outputs, kv=kv, cuda=cuda, copies=copies))

    def drafter_ctx(self, n_ctx: int) -> int:
        cap = self.w.drafter_ctx_cap
        return min(n_ctx, cap) if cap else n_ctx

    def slot_devices(self, p: Placement) -> list[int | None]:
        """Device (position in ``p.gpus``) of every block slot, ``None`` for the host; last slot = output."""
        n_slots = self.t.n_layer_all + 1
        start = n_slots - p.n_gpu_layers
        out: list[int | None] = [None] * n_slots
        bounds = []
        acc = 0
        for s in p.slots:
            acc += s
            bounds.append(acc)
        for il in range(start, n_slots):
            rel = il - start
            out[il] = next((g for g, b in enumerate(bounds) if b > rel), len(bounds) - 1)
        return out

    def price(self, c: Config) -> tuple[list[DeviceUse], DeviceUse]:
        t, w, p = self.t, self.w, c.placement
        gpu_rows = [DeviceUse(f"GPU{self.gpus[g].index} {self.gpus[g].name}", self.gpus[g].index,
                              self.gpus[g].free - w.margin, overhead=w.overhead) for g in p.gpus]
        host = DeviceUse("host RAM", None, self.host.available - w.margin)
        where = self.slot_devices(p)
        layer_bytes = self.layer_bytes
        expert_bytes = self.expert_bytes
        kv = self.kv(t, c.n_ctx, c.kv)
        rs = self.rs
        tensor_split = p.split_mode == "tensor" and len(p.gpus) > 1
        host.target_weights += t.input_bytes
        for il in range(t.n_layer_all):
            dev = where[il]
            state = kv.get(il, 0) + rs.get(il, 0)
            if dev is None:
                host.target_weights += layer_bytes[il]
                host.target_kv += state
                continue
            on_host = expert_bytes[il] if il < p.host_expert_layers else 0
            host.target_weights += on_host
            if tensor_split:
                for g, row in enumerate(gpu_rows):
                    share = p.slots[g] / sum(p.slots)
                    row.target_weights += int((layer_bytes[il] - on_host) * share)
                    row.target_kv += int(state * share)
            else:
                gpu_rows[dev].target_weights += layer_bytes[il] - on_host
                gpu_rows[dev].target_kv += state
        out_dev = where[t.n_layer_all]
        if out_dev is None:
            host.target_weights += t.output_bytes
        else:
            gpu_rows[out_dev].target_weights += t.output_bytes + t.tied_head_bytes

        T = min(pad_ctx(c.n_ctx), w.n_ubatch)
        pipeline = (len(p.gpus) > 1 and p.split_mode == "layer" and p.n_gpu_layers == t.n_layer_all + 1
                    and not p.host_expert_layers)
        copies = PIPELINE_COPIES if pipeline else 1
        for g, row in enumerate(gpu_rows):
            layers = [il for il in range(t.n_layer_all) if where[il] == g or (tensor_split and where[il] is not None)]
            row.target_compute = self.compute(t, layers, out_dev == g or tensor_split, c.n_ctx, c.kv, True,
                                              self.n_outputs, copies)
            if T >= 32 and g == 0:
                row.target_compute += self._host_weight_copy(p, where)
        host_layers = [il for il in range(t.n_layer_all) if where[il] is None]
        if host_layers or out_dev is None:
            host.target_compute = self.compute(t, host_layers, out_dev is None, c.n_ctx, c.kv, False, self.n_outputs)
        if gpu_rows:
            host.target_compute += 2 * t.n_embd * T * 4  # token embedding rows gathered on the host
        taps = len(self.d.target_layers) if self.d is not None and (self.d.is_dflash or self.d.is_eagle3) else 0
        host.overhead = t.output_vocab * self.n_outputs * 4 + taps * t.n_embd * w.n_batch * 4

        if self.d is not None:
            self._price_drafter(c, gpu_rows[out_dev] if out_dev is not None else host, host)
        if self.mtp:
            from localflash.plan.mtp import price_mtp

            price_mtp(self, c, gpu_rows, host, where)
        return gpu_rows, host

    def _host_weight_copy(self, p: Placement, where: list[int | None]) -> int:
        """op_offload: large-batch matmuls of host-resident weights run on GPU 0 from a copy in its compute buffer."""
        on_host = [self.biggest_matmul[il] for il in range(self.t.n_layer_all) if where[il] is None]
        experts = self.biggest_expert[: p.host_expert_layers]
        return max(on_host + experts, default=0)

    def drafter_kv(self, c: Config) -> str:
        """The drafter's cache type: as asked, else the cheaper of f16 and the target's type.

        On CUDA a quantized cache also needs f16 copies of one layer's K and V in the compute
        buffer, so for a drafter with few cached layers (DFlash) f16 is often the cheaper one."""
        if self.w.drafter_kv:
            return self.w.drafter_kv
        options = {kv: self._drafter_cost(c, kv, cuda=bool(c.placement.gpus)) for kv in dict.fromkeys(("f16", c.kv))}
        return min(options, key=lambda kv: sum(options[kv]))

    def _drafter_cost(self, c: Config, kv: str, cuda: bool) -> tuple[int, int]:
        d = self.d
        n_ctx = self.drafter_ctx(c.n_ctx)
        cache = sum(self.kv(d, n_ctx, kv).values())
        compute = self.compute(d, list(range(d.n_layer)), True, n_ctx, kv, cuda, d.block_size or 1)
        return cache, compute

    def _price_drafter(self, c: Config, row: DeviceUse, host: DeviceUse) -> None:
        d = self.d
        on_gpu = row is not host
        row.drafter_weights = sum(d.layer_bytes) + d.output_bytes + (d.tied_head_bytes if on_gpu else 0)
        host.drafter_weights += d.input_bytes
        row.drafter_kv, row.drafter_compute = self._drafter_cost(c, self.drafter_kv(c), cuda=on_gpu)
        if d.is_eagle3:  # the encoder outputs every row: logits and g buffers sized by its chunk
            host.overhead += (d.n_vocab + d.n_embd) * EAGLE3_ENCODE_ROWS * 4
        else:
            host.overhead += d.output_vocab * (d.block_size or 1) * 4
        if d.selector_top_k:  # DFlash2: one lattice row per batch position
            host.overhead += d.n_embd * self.w.n_batch * 4

    def fits(self, c: Config) -> bool:
        rows, host = self.price(c)
        return all(r.free >= 0 for r in rows) and host.free >= 0

    def headroom(self, c: Config) -> int:
        rows, host = self.price(c)
        return min([r.free for r in rows] + [host.free])


# --- search -------------------------------------------------------------------


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
        room = pr.headroom(cand)
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
    if d is not None and d_ctx < c.n_ctx:
        full = sum(kv_bytes_per_layer(d, c.n_ctx, c.kv, w.n_ubatch).values())
        capped = sum(kv_bytes_per_layer(d, d_ctx, c.kv, w.n_ubatch).values())
        changes.append(Change("drafter_n_ctx", d_ctx, f"inheriting {c.n_ctx} (llama.cpp's default) would cost "
                              f"{format_size(full - capped)} more; drafting stops past {d_ctx} tokens"))
    if pr.mtp:
        from localflash.plan.mtp import mtp_kv_bytes, mtp_weight_bytes

        changes.append(Change("load_mtp", True, f"MTP drafting: the nextn block ({format_size(mtp_weight_bytes(t))}) "
                              f"and the MTP context's KV cache ({format_size(mtp_kv_bytes(t, c.n_ctx, c.kv, w.n_ubatch))})"
                              " are in the drafter column"))
    if pr.n_rs_seq:
        changes.append(Change("n_rs_seq", pr.n_rs_seq, "hybrid target: keep recurrent-state snapshots so a rejected "
                              f"draft of up to {w.n_draft} tokens can be rolled back"))
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
        main_gpu=pr.gpus[p.gpus[0]].index if p.gpus else 0,
        tensor_split=_split_by_device(pr, p) if len(p.gpus) > 1 else None,
        tensor_overrides=overrides,
        drafter_device=pr.gpus[p.gpus[out_dev]].index if (d is not None and out_dev is not None and p.gpus) else None,
        drafter_n_ctx=pad_ctx(d_ctx) if d is not None else 0,
        drafter_type_kv=pr.drafter_kv(c) if d is not None else "",
        drafter_n_gpu_layers=(d.n_layer_all + 1) if (d is not None and out_dev is not None and p.gpus) else 0,
        slowdown=round(slowdown, 2),
        context_options=options,
        changes=changes,
        warnings=warnings,
        mtp=pr.mtp,
    )


def _split_by_device(pr: Pricer, p: Placement) -> list[float]:
    """``tensor_split`` as llama.cpp reads it: one entry per device index, 0 for cards the plan leaves out."""
    out = [0.0] * (max(pr.gpus[g].index for g in p.gpus) + 1)
    total = sum(p.slots)
    for g, slots in zip(p.gpus, p.slots):
        out[pr.gpus[g].index] = float(slots) if p.split_mode == "layer" else round(slots / total, 4)
    return out


def runtime_kwargs(plan: Plan) -> dict:
    """The settings the runtime passes to llama.cpp, as one dict.

    Target model params: ``n_gpu_layers`` (int), ``split_mode`` (llama_split_mode int: 0 none, 1 layer,
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
