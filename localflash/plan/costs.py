"""The planner's cost formulas: what a KV cache, a recurrent state and a compute buffer take, in bytes.

Pure arithmetic on GGUF metadata (``localflash.formats.gguf_meta``), following the vendored llama.cpp (0.3.36):

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
- the **decode slowdown** of weights read from host RAM instead of VRAM.
"""

from __future__ import annotations

from localflash.archs import GATED_QUERY_ARCHS
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
