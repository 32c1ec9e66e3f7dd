"""GGUF files with real tensor shapes and quant types but no real data.

A shaped file has the header a converted-and-quantized model would have (keys,
tensor names, ggml shapes, per-tensor quant types chosen by a port of the
main rules of llama.cpp's ``llama_tensor_get_type``) and a data section that
is a sparse, zero-filled region made with ``truncate``: a 17 GB model takes a
few kilobytes of disk. The planner reads such files exactly like real ones,
which lets tests pin plans for models nobody downloads in CI.

``write_shaped(path, spec, ftype)`` writes one; ``PRESETS`` holds the specs of
the models localflash's plans are checked on (dimensions from the public
``config.json`` files). With ``tokenizer=True`` a placeholder SentencePiece
vocabulary of the right size is added so llama.cpp itself can open the file
(for ``no_alloc`` dry runs; outputs are meaningless).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as Q, LlamaFileType, TokenType

from localflash.formats.dflash_gguf import DFLASH2_KEYS
from localflash.formats.gguf_meta import tensor_bytes
from localflash.formats.gguf_write import add_decoder_keys, add_expert_keys, add_ssm_keys, copy_tokenizer


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of a decoder (HF ``config.json`` names in comments)."""

    arch: str
    name: str
    n_layer: int  # num_hidden_layers
    n_embd: int  # hidden_size
    n_ff: int  # intermediate_size
    n_head: int  # num_attention_heads
    n_head_kv: int  # num_key_value_heads
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    tied: bool = False  # tie_word_embeddings
    rope_theta: float = 1e6
    # hybrid (qwen35): Gated-DeltaNet blocks between full-attention blocks
    full_attention_interval: int = 0
    linear_k_heads: int = 0  # linear_num_key_heads
    linear_v_heads: int = 0  # linear_num_value_heads
    linear_head_dim: int = 0  # linear_key_head_dim == linear_value_head_dim
    conv_kernel: int = 4
    n_nextn: int = 0  # mtp_num_hidden_layers: extra MTP blocks llama.cpp loads only for MTP drafting
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0  # moe_intermediate_size
    # dflash drafter
    target_layers: tuple[int, ...] = ()  # llama.cpp convention: HF target_layer_ids + 1
    block_size: int = 16
    swa_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    # dflash2: two-tap dynamic convolutions per layer and a candidate selector
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    # eagle3: one decoder layer over [embedding, g]; fc over 3 target layers; own head over draft_vocab ids (d2t)
    target_hidden_size: int = 0
    draft_vocab: int = 0
    extra_keys: dict = field(default_factory=dict)


PRESETS: dict[str, ModelSpec] = {
    # Qwen/Qwen3.6-27B (same text dims as Qwen3.5-27B); 48 Gated-DeltaNet + 16 attention blocks
    "qwen3.6-27b": ModelSpec(
        "qwen35", "Qwen3.6-27B", n_layer=64, n_embd=5120, n_ff=17408, n_head=24, n_head_kv=4, head_dim=256,
        n_vocab=248320, n_ctx_train=262144, rope_theta=1e7, full_attention_interval=4,
        linear_k_heads=16, linear_v_heads=48, linear_head_dim=128, conv_kernel=4, n_nextn=1,
    ),
    # z-lab/Qwen3.6-27B-DFlash: 5 Qwen3 blocks, no embedding or head; blocks 0-3 sliding window 2048
    "qwen3.6-27b-dflash": ModelSpec(
        "dflash", "Qwen3.6-27B-DFlash", n_layer=5, n_embd=5120, n_ff=17408, n_head=32, n_head_kv=8, head_dim=128,
        n_vocab=248320, n_ctx_train=262144, rope_theta=1e7, target_layers=(2, 17, 32, 47, 62),
        swa_window=2048, swa_layers=(True, True, True, True, False),
    ),
    # incoai/Qwen3.8-27B-DFlash2-GGUF, the sidecar for a Qwen3.8-27B target (Qwen3.6-27B text dims): block 8,
    # five sliding-window (2048) layers, two-tap dynamic convolutions, top-k selector. Layer dims as the
    # Qwen3.6-27B DFlash; conv group 128, selector rank 256 and top-k 8 are assumed (no config.json offline)
    "qwen3.8-27b-dflash2": ModelSpec(
        "dflash", "Qwen3.8-27B-DFlash2", n_layer=5, n_embd=5120, n_ff=17408, n_head=32, n_head_kv=8, head_dim=128,
        n_vocab=248320, n_ctx_train=262144, rope_theta=1e7, target_layers=(2, 17, 32, 47, 62), block_size=8,
        swa_window=2048, swa_layers=(True,) * 5, conv_kernel_size=2, conv_group_size=128, selector_rank=256,
        selector_top_k=8,
    ),
    "qwen3-8b": ModelSpec(
        "qwen3", "Qwen3-8B", n_layer=36, n_embd=4096, n_ff=12288, n_head=32, n_head_kv=8, head_dim=128,
        n_vocab=151936, n_ctx_train=40960,
    ),
    # an EAGLE-3 drafter for Qwen3-8B (AngelSlim/Tengyun layout): one Llama layer of the target's width,
    # taps [2, 18, 33] (llama.cpp's default 2, L/2, L-3), its own head over 32000 draft ids (d2t), no embedding
    "qwen3-8b-eagle3": ModelSpec(
        "eagle3", "Qwen3-8B-EAGLE3", n_layer=1, n_embd=4096, n_ff=12288, n_head=32, n_head_kv=8, head_dim=128,
        n_vocab=151936, n_ctx_train=40960, target_layers=(2, 18, 33), target_hidden_size=4096, draft_vocab=32000,
    ),
    "qwen3-32b": ModelSpec(
        "qwen3", "Qwen3-32B", n_layer=64, n_embd=5120, n_ff=25600, n_head=64, n_head_kv=8, head_dim=128,
        n_vocab=151936, n_ctx_train=40960,
    ),
    "qwen3-0.6b": ModelSpec(
        "qwen3", "Qwen3-0.6B", n_layer=28, n_embd=1024, n_ff=3072, n_head=16, n_head_kv=8, head_dim=128,
        n_vocab=151936, n_ctx_train=40960, tied=True,
    ),
    "qwen3-30b-a3b": ModelSpec(
        "qwen3moe", "Qwen3-30B-A3B", n_layer=48, n_embd=2048, n_ff=6144, n_head=32, n_head_kv=4, head_dim=128,
        n_vocab=151936, n_ctx_train=40960, n_expert=128, n_expert_used=8, n_ff_exp=768,
    ),
}

FTYPES = {
    "F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "IQ4_XS": LlamaFileType.MOSTLY_IQ4_XS,
}
_BASE = {"F32": Q.F32, "F16": Q.F16, "Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q4_1": Q.Q4_1, "Q4_K_M": Q.Q4_K, "IQ4_XS": Q.IQ4_XS}
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}
_NOT_QUANTIZED = re.compile(r"_norm\.weight$|ssm_conv1d|ffn_gate_inp\.weight$|\.bias$|_conv_base$")


def tensor_shapes(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and ggml shapes (ne0 first) in file order, as llama.cpp's loader expects them."""
    d, hd = spec.n_embd, spec.head_dim
    out: list[tuple[str, tuple[int, ...]]] = []
    if spec.arch == "eagle3":
        return _eagle3_shapes(spec)
    if spec.arch == "dflash":
        out.append(("fc.weight", (len(spec.target_layers) * d, d)))
        out.append(("enc.output_norm.weight", (d,)))
        if spec.selector_top_k:
            out += [("selector_predecessor.weight", (spec.selector_rank, spec.n_vocab)),
                    ("selector_successor.weight", (spec.selector_rank, spec.n_vocab)),
                    ("selector_hidden.weight", (d, spec.selector_rank))]
    else:
        out.append(("token_embd.weight", (d, spec.n_vocab)))
    for il in range(spec.n_layer + spec.n_nextn):
        b = f"blk.{il}."
        out.append((b + "attn_norm.weight", (d,)))
        recurrent = il < spec.n_layer and spec.full_attention_interval and (il + 1) % spec.full_attention_interval != 0
        if recurrent:
            key_dim = spec.linear_head_dim * spec.linear_k_heads
            value_dim = spec.linear_head_dim * spec.linear_v_heads
            conv_dim = 2 * key_dim + value_dim
            out += [
                (b + "attn_qkv.weight", (d, conv_dim)),
                (b + "attn_gate.weight", (d, value_dim)),
                (b + "ssm_conv1d.weight", (spec.conv_kernel, conv_dim)),
                (b + "ssm_dt.bias", (spec.linear_v_heads,)),
                (b + "ssm_a", (spec.linear_v_heads,)),
                (b + "ssm_beta.weight", (d, spec.linear_v_heads)),
                (b + "ssm_alpha.weight", (d, spec.linear_v_heads)),
                (b + "ssm_norm.weight", (spec.linear_head_dim,)),
                (b + "ssm_out.weight", (value_dim, d)),
            ]
        else:
            q_width = hd * spec.n_head * (2 if spec.arch in ("qwen35", "qwen35moe") else 1)  # qwen35: query + gate
            out += [
                (b + "attn_q.weight", (d, q_width)),
                (b + "attn_k.weight", (d, hd * spec.n_head_kv)),
                (b + "attn_v.weight", (d, hd * spec.n_head_kv)),
                (b + "attn_output.weight", (hd * spec.n_head, d)),
            ]
            if spec.arch in ("qwen3", "qwen3moe", "qwen35", "qwen35moe", "dflash"):
                out += [(b + "attn_q_norm.weight", (hd,)), (b + "attn_k_norm.weight", (hd,))]
        if spec.arch in ("qwen35", "qwen35moe"):
            out.append((b + "post_attention_norm.weight", (d,)))
        else:
            out.append((b + "ffn_norm.weight", (d,)))
        if spec.n_expert:
            out += [
                (b + "ffn_gate_inp.weight", (d, spec.n_expert)),
                (b + "ffn_gate_exps.weight", (d, spec.n_ff_exp, spec.n_expert)),
                (b + "ffn_up_exps.weight", (d, spec.n_ff_exp, spec.n_expert)),
                (b + "ffn_down_exps.weight", (spec.n_ff_exp, d, spec.n_expert)),
            ]
        else:
            out += [
                (b + "ffn_gate.weight", (d, spec.n_ff)),
                (b + "ffn_up.weight", (d, spec.n_ff)),
                (b + "ffn_down.weight", (spec.n_ff, d)),
            ]
        if spec.selector_top_k:
            projected = 2 * spec.conv_kernel_size * (d // spec.conv_group_size)
            for part in ("attn", "ffn"):
                out += [(b + f"{part}_conv_base", (d, spec.conv_kernel_size, 2)), (b + f"{part}_conv_proj.weight", (d, projected))]
        if il >= spec.n_layer:
            out += [
                (b + "nextn.eh_proj.weight", (2 * d, d)),
                (b + "nextn.enorm.weight", (d,)),
                (b + "nextn.hnorm.weight", (d,)),
                (b + "nextn.shared_head_norm.weight", (d,)),
            ]
    out.append(("output_norm.weight", (d,)))
    if spec.arch != "dflash" and not spec.tied:
        out.append(("output.weight", (d, spec.n_vocab)))
    return out


def _eagle3_shapes(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    d, hd = spec.n_embd, spec.head_dim
    b = "blk.0."
    out = [("fc.weight", (len(spec.target_layers) * spec.target_hidden_size, d))]
    out += [(b + "attn_norm.weight", (d,)), (b + "attn_norm_2.weight", (d,)),
            (b + "attn_q.weight", (2 * d, hd * spec.n_head)), (b + "attn_k.weight", (2 * d, hd * spec.n_head_kv)),
            (b + "attn_v.weight", (2 * d, hd * spec.n_head_kv)), (b + "attn_output.weight", (hd * spec.n_head, d)),
            (b + "ffn_norm.weight", (d,)), (b + "ffn_gate.weight", (d, spec.n_ff)), (b + "ffn_up.weight", (d, spec.n_ff)),
            (b + "ffn_down.weight", (spec.n_ff, d)), ("output_norm.weight", (d,))]
    if spec.draft_vocab:
        out += [("output.weight", (d, spec.draft_vocab)), ("d2t", (spec.draft_vocab,))]
    return out


def quant_types(spec: ModelSpec, shapes: list[tuple[str, tuple[int, ...]]], ftype: str) -> list[Q]:
    """Per-tensor types for ``ftype``, following the main rules of llama.cpp's ``llama_tensor_get_type``."""
    base = _BASE[ftype]
    n_attn_v = sum(1 for name, _ in shapes if name.endswith(("attn_v.weight", "attn_qkv.weight")))
    n_gqa = spec.n_head // max(spec.n_head_kv, 1)
    i_attn_v = i_ffn_down = 0
    types = []
    for name, shape in shapes:
        if name == "d2t":
            types.append(Q.I64)
            continue
        if len(shape) < 2 or _NOT_QUANTIZED.search(name) or base == Q.F32:
            types.append(Q.F32)
            continue
        t = base
        block = _block(name)
        if name == "output.weight" or (spec.tied and name == "token_embd.weight"):
            t = Q.Q6_K if base not in (Q.Q8_0, Q.F16) else base
        elif name.endswith(("attn_v.weight", "attn_qkv.weight")):
            if ftype == "Q4_K_M" and _more_bits(i_attn_v, n_attn_v):
                t = Q.Q6_K
            elif ftype == "IQ4_XS" and n_gqa >= 4:
                t = Q.Q5_K
            i_attn_v += 1
        elif "ffn_down" in name:
            i_layer = block if spec.n_expert else i_ffn_down
            n_blocks = spec.n_layer + spec.n_nextn
            if ftype == "Q4_K_M" and _more_bits(i_layer, n_blocks):
                t = Q.Q6_K
            elif ftype == "IQ4_XS" and i_layer < n_blocks // 8:
                t = Q.Q5_K
            i_ffn_down += 1
        block_size = {Q.Q4_K: 256, Q.Q5_K: 256, Q.Q6_K: 256, Q.IQ4_XS: 256}.get(t, 32 if t not in (Q.F16, Q.F32) else 1)
        if shape[0] % block_size:
            t = _FALLBACK.get(t, Q.F16)
        types.append(t)
    return types


def write_shaped(path: str | Path, spec: ModelSpec, ftype: str = "Q4_K_M", tokenizer: bool = False) -> Path:
    """Write a shaped GGUF for ``spec`` quantized as ``ftype``; the data section is a sparse zero region."""
    path = Path(path)
    shapes = tensor_shapes(spec)
    types = quant_types(spec, shapes, ftype)
    w = GGUFWriter(str(path), spec.arch)
    _add_keys(w, spec, ftype)
    if tokenizer:
        _add_placeholder_vocab(w, spec.n_vocab)
    total = 0
    for (name, shape), t in zip(shapes, types):
        nbytes = tensor_bytes(int(t), shape)
        w.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32), nbytes, raw_dtype=t)
        total += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    fout.truncate(fout.tell() + total)
    w.close()
    return path


def write_preset(directory: str | Path, preset: str, ftype: str = "Q4_K_M", tokenizer: bool = False) -> Path:
    """Write ``PRESETS[preset]`` as ``<directory>/<name>-<ftype>.gguf`` (kept if it already exists)."""
    spec = PRESETS[preset]
    path = Path(directory) / f"{spec.name}-{ftype}{'-vocab' if tokenizer else ''}.gguf"
    if not path.exists():
        write_shaped(path, spec, ftype, tokenizer)
    return path


def _add_keys(w: GGUFWriter, spec: ModelSpec, ftype: str) -> None:
    a = spec.arch
    w.add_name(f"{spec.name} (shaped, no weights)")
    w.add_file_type(int(FTYPES[ftype]))
    add_decoder_keys(w, n_ctx_train=spec.n_ctx_train, n_embd=spec.n_embd, n_block=spec.n_layer + spec.n_nextn,
                     n_ff=spec.n_ff, n_head=spec.n_head, n_head_kv=spec.n_head_kv, rms_eps=1e-6, head_dim=spec.head_dim,
                     rope_theta=spec.rope_theta, n_vocab=spec.n_vocab, n_nextn=spec.n_nextn)
    if spec.full_attention_interval:
        add_ssm_keys(w, full_attention_interval=spec.full_attention_interval, conv_kernel=spec.conv_kernel,
                     head_dim=spec.linear_head_dim, k_heads=spec.linear_k_heads, v_heads=spec.linear_v_heads)
        w.add_rope_dimension_count(spec.head_dim // 4)
        w.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
    if spec.n_expert:
        add_expert_keys(w, n_expert=spec.n_expert, n_expert_used=spec.n_expert_used, n_ff_exp=spec.n_ff_exp)
    if spec.target_layers:
        w.add_array(f"{a}.target_layers", list(spec.target_layers))
        if a == "dflash":
            w.add_uint32(f"{a}.block_size", spec.block_size)
    if spec.selector_top_k:
        for key in DFLASH2_KEYS:
            w.add_uint32(f"{a}.{key}", getattr(spec, key))
    if spec.target_hidden_size:
        w.add_uint32(f"{a}.target_hidden_size", spec.target_hidden_size)
    if spec.swa_window:
        w.add_uint32(f"{a}.attention.sliding_window", spec.swa_window)
        w.add_array(f"{a}.attention.sliding_window_pattern", [bool(x) for x in spec.swa_layers])
    for key, value in spec.extra_keys.items():
        w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, str(value))


def _add_placeholder_vocab(w: GGUFWriter, n_vocab: int) -> None:
    """A loadable SentencePiece vocab of ``n_vocab`` pieces: control tokens, 256 byte tokens, filler pieces."""
    special = ["<unk>", "<s>", "</s>"]
    pieces = special + [f"<0x{i:02X}>" for i in range(256)]
    pieces += [f"\u2581p{i}" for i in range(n_vocab - len(pieces))]
    kinds = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    kinds += [TokenType.NORMAL] * (n_vocab - len(kinds))
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([int(k) for k in kinds])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def _block(name: str) -> int:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m[1]) if m else -1


def _more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


# (block elements, bytes per block, byte offsets of fp16 scale fields) of the types the writers use
SCALE_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
}


def write_random(path: Path, spec: ModelSpec, ftype: str, pool: np.ndarray, mask_token: int | None = None,
                 tokenizer_from: str | Path | None = None) -> Path:
    """Like write_shaped, but every tensor holds random data (scales set so weights stay small).

    ``tokenizer_from``: a GGUF whose real tokenizer is copied (its size must be ``spec.n_vocab``) instead of the
    placeholder vocabulary, e.g. the sdist's ``models/ggml-vocab-qwen2.gguf``.
    """
    shapes = tensor_shapes(spec)
    types = quant_types(spec, shapes, ftype)
    w = GGUFWriter(str(path), spec.arch)
    _add_keys(w, spec, ftype)
    if tokenizer_from is None:
        _add_placeholder_vocab(w, spec.n_vocab)
    elif copy_tokenizer(w, tokenizer_from) != spec.n_vocab:
        raise ValueError(f"{tokenizer_from} does not hold {spec.n_vocab} tokens")
    if mask_token is not None:
        w.add_mask_token_id(mask_token)
    sizes = []
    for (name, shape), t in zip(shapes, types):
        nbytes = tensor_bytes(int(t), shape)
        w.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32), nbytes, raw_dtype=t)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    w.write_padding(f, f.tell())
    rng = np.random.default_rng(0)
    small = {2: np.float16(2e-4).tobytes(), 1: np.float16(1e-3).tobytes()}
    for (name, shape), t, nbytes in zip(shapes, types, sizes):
        if t == Q.F32:
            n = int(np.prod(shape))
            if name.endswith(("norm.weight",)):
                data = np.ones(n, np.float32)
            elif name.endswith("ssm_a"):
                data = -np.exp(rng.standard_normal(n).astype(np.float32) * 0.1)
            elif name.endswith(".bias"):
                data = np.zeros(n, np.float32)
            else:
                data = (rng.standard_normal(n) * 0.02).astype(np.float32)
            buf = data.tobytes()
        elif t in (Q.F16, Q.BF16):
            data = (rng.standard_normal(int(np.prod(shape))) * 0.02).astype(np.float16)
            buf = data.tobytes() if t == Q.F16 else (data.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        else:
            from gguf import GGML_QUANT_SIZES

            _, bsize = GGML_QUANT_SIZES[t]
            reps = -(-nbytes // len(pool))
            raw = np.tile(pool, reps)[:nbytes].copy() if reps > 1 else pool[:nbytes].copy()
            blocks = raw.reshape(-1, bsize)
            for i, off in enumerate(SCALE_FIELDS.get(t, ())):
                blocks[:, off : off + 2] = np.frombuffer(small[1 if (i == 1 or t in (Q.Q8_0, Q.Q6_K, Q.Q5_0, Q.Q4_0)) else 2], np.uint8)
            buf = raw.tobytes()
        assert len(buf) == nbytes, (name, len(buf), nbytes)
        f.write(buf)
        w.write_padding(f, nbytes)
    w.close()
    return path
