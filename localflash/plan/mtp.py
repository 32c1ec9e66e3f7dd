"""What MTP drafting adds to a plan: the nextn block's weights, the MTP context's KV cache and compute buffer.

llama.cpp (0.3.36) loads a Qwen3.5/3.6 GGUF's MTP ("nextn") blocks only with
``load_mtp``; they sit in block slots ``n_layer .. n_layer_all-1`` and are placed
like any block. The MTP context (``LLAMA_CONTEXT_TYPE_MTP``) holds a plain
attention KV cache for the nextn blocks only, as long as the target's context,
and runs a one-block graph (embedding + hidden state through ``eh_proj``, one
full-attention decoder block, the LM head for its one output row). The target
context also exports every token's hidden state to the host (``n_embd`` floats
per batch row). The planner shows all of it in the drafter column.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from localflash.formats.gguf_meta import ModelMeta
from localflash.plan.costs import kv_bytes_per_layer, pad_ctx


def nextn_view(meta: ModelMeta) -> ModelMeta:
    """The same model with its nextn blocks counted as ordinary (attention) blocks, for the KV cost model."""
    return replace(meta, n_layer=meta.n_layer_all, n_layer_nextn=0, load_mtp=True)


def nextn_blocks(meta: ModelMeta) -> list[int]:
    return list(range(meta.n_layer, meta.n_layer_all))


def mtp_weight_bytes(meta: ModelMeta) -> int:
    """Bytes of the nextn blocks' tensors (what ``load_mtp`` adds to the model buffers)."""
    return sum(t.n_bytes for t in meta.tensors if t.layer is not None and t.layer >= meta.n_layer)


def mtp_kv_bytes(meta: ModelMeta, n_ctx: int, kv: str, n_ubatch: int) -> int:
    """KV cache of the MTP context: the nextn blocks at the target's context length."""
    per_layer = kv_bytes_per_layer(nextn_view(meta), n_ctx, kv, n_ubatch)
    return sum(per_layer.get(il, 0) for il in nextn_blocks(meta))


def mtp_compute_bytes(meta: ModelMeta, n_ctx: int, n_ubatch: int, kv: str, cuda: bool, n_outputs: int = 1) -> int:
    """Compute buffer of the MTP context's one-block graph at ``n_ubatch`` pairs (flash attention, one output row).

    With a single block the attention mask does not outlive the attention, so the buffer is the larger of
    the attention stage (mask, query + gate, output, K/V activations and their casts) and the FFN stage;
    fitted to llama.cpp's own reports for the tiny qwen35 and a Qwen3.6-27B-shaped file (``tests/plan/test_mtp_plan.py``).
    """
    T = min(n_ubatch, pad_ctx(n_ctx))
    cells = pad_ctx(n_ctx)
    E, hd, hd_v = meta.n_embd, meta.head_dim_k, meta.head_dim_v
    il = meta.n_layer
    n_head, n_kv = meta.n_head[il], meta.n_head_kv[il]
    kv_act = n_kv * (hd + hd_v) * T * 4
    attn = cells * T * 2 + 2 * n_head * hd * T * 4 + n_head * hd_v * T * 4 + 2 * kv_act
    if cuda and kv != "f16":
        attn += cells * n_kv * (hd + hd_v) * 2  # f16 copies of K and V for the batched kernels
    ffn = 3 * meta.n_ff * T * 4 + 5 * E * T * 2 + cells * 128
    out = meta.output_vocab * n_outputs * 4 + E * T * 4
    return max(attn, ffn, out) + T * 32


@dataclass
class MtpCost:
    """What MTP drafting adds to a placement. Device keys are positions in the placement's GPU list, ``None`` the host."""

    nextn_weights: dict[int | None, int]  # bytes of the nextn blocks per device: target column -> drafter column
    device: int | None  # where the MTP context runs (the device of the first nextn block)
    kv: int  # the MTP context's KV cache, on ``device``
    compute: int  # its compute buffer, on ``device``
    host_outputs: int  # host buffers: the MTP row's logits and hidden state, the target's exported hidden states


def mtp_cost(meta: ModelMeta, where: list[int | None], n_ctx: int, kv: str, n_ubatch: int, n_batch: int, n_seq: int = 1) -> MtpCost:
    """The MTP block's cost on each device, for block slots placed as ``where`` (device of every slot).

    ``n_seq`` parallel slots: one MTP context of ``n_ctx`` positions in all, a draft decode outputs a row a slot."""
    weights: dict[int | None, int] = {}
    for il in nextn_blocks(meta):
        weights[where[il]] = weights.get(where[il], 0) + meta.layer_bytes[il]
    dev = where[meta.n_layer]
    return MtpCost(
        nextn_weights=weights,
        device=dev,
        kv=mtp_kv_bytes(meta, n_ctx, kv, n_ubatch),
        compute=mtp_compute_bytes(meta, n_ctx, n_ubatch, kv, cuda=dev is not None, n_outputs=n_seq),
        host_outputs=(meta.output_vocab + meta.n_embd) * n_seq * 4 + meta.n_embd * n_batch * 4,
    )
