"""Writing GGUF keys: a tokenizer copied from another file, and the shape keys decoder archs share.

Key names are llama.cpp's (``src/llama-arch.cpp``), under the writer's arch
(``<arch>.block_count``, ``<arch>.ssm.conv_kernel`` ...). Used by the DFlash
writer (:mod:`localflash.formats.dflash_gguf`) and by the test fixtures that
write random-weight and shaped models.
"""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

_ADDERS = {  # GGUF value type of a tokenizer key -> the GGUFWriter method that writes it
    GGUFValueType.ARRAY: "add_array",
    GGUFValueType.STRING: "add_string",
    GGUFValueType.BOOL: "add_bool",
    GGUFValueType.UINT32: "add_uint32",
    GGUFValueType.INT32: "add_int32",
    GGUFValueType.FLOAT32: "add_float32",
}


def copy_tokenizer(writer: GGUFWriter, source: str | Path, rename_tokens: bool = False, skip: tuple[str, ...] = ()) -> int:
    """Copy every ``tokenizer.*`` key of ``source`` (except ``skip``) into ``writer``; return the vocab size."""
    reader = GGUFReader(str(source))
    n_vocab = 0
    for name, fld in reader.fields.items():
        if not name.startswith("tokenizer.") or name in skip:
            continue
        kind = fld.types[0]
        value = fld.contents()
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
            if rename_tokens:
                value = [t if i < 3 else f"{t}~" for i, t in enumerate(value)]
        if kind not in _ADDERS:
            raise ValueError(f"unsupported tokenizer field type {kind} for {name}")
        getattr(writer, _ADDERS[kind])(name, value)
    return n_vocab


def add_decoder_keys(
    w: GGUFWriter,
    *,
    n_ctx_train: int,
    n_embd: int,
    n_block: int,
    n_ff: int,
    n_head: int,
    n_head_kv: int,
    rms_eps: float,
    head_dim: int | None = None,
    rope_theta: float | None = None,
    n_rot: int | None = None,
    n_vocab: int | None = None,
    n_nextn: int = 0,
) -> None:
    """Context, widths, block count (``n_nextn`` of them MTP blocks), heads, head sizes, RMS epsilon, RoPE, vocab.

    ``head_dim`` is written as both key and value length, ``n_rot`` as the RoPE dimension count;
    ``None`` leaves a key out (llama.cpp then derives it).
    """
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_block)
    if n_nextn:
        w.add_uint32(f"{w.arch}.nextn_predict_layers", n_nextn)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(rms_eps)
    if rope_theta is not None:
        w.add_rope_freq_base(rope_theta)
    if n_rot is not None:
        w.add_rope_dimension_count(n_rot)
    if n_vocab is not None:
        w.add_vocab_size(n_vocab)


def add_ssm_keys(w: GGUFWriter, *, full_attention_interval: int, conv_kernel: int, head_dim: int, k_heads: int, v_heads: int) -> None:
    """The Gated-DeltaNet keys of a hybrid (``qwen35``, ``qwen3next``): every ``full_attention_interval``-th block
    is full attention, the others linear attention with ``k_heads``/``v_heads`` heads of ``head_dim``."""
    a = w.arch
    w.add_uint32(f"{a}.full_attention_interval", full_attention_interval)
    w.add_uint32(f"{a}.ssm.conv_kernel", conv_kernel)
    w.add_uint32(f"{a}.ssm.state_size", head_dim)
    w.add_uint32(f"{a}.ssm.group_count", k_heads)
    w.add_uint32(f"{a}.ssm.time_step_rank", v_heads)
    w.add_uint32(f"{a}.ssm.inner_size", head_dim * v_heads)


def add_expert_keys(w: GGUFWriter, *, n_expert: int, n_expert_used: int, n_ff_exp: int, n_ff_shexp: int | None = None) -> None:
    """The mixture-of-experts keys; ``n_ff_shexp``: the shared expert's width, when there is one."""
    a = w.arch
    w.add_uint32(f"{a}.expert_count", n_expert)
    w.add_uint32(f"{a}.expert_used_count", n_expert_used)
    w.add_uint32(f"{a}.expert_feed_forward_length", n_ff_exp)
    if n_ff_shexp is not None:
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", n_ff_shexp)
