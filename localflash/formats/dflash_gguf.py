"""The DFlash and DFlash2 drafter GGUF format: llama.cpp's ``dflash`` arch (``src/models/dflash.cpp``).

A drafter is a :class:`DFlashSpec` (shape and settings, in llama.cpp's
conventions: ``target_layers`` are layer *inputs*, HF ids + 1) plus its tensors
under GGUF names. :func:`write_dflash_gguf` streams one to disk with the keys
llama.cpp's loader reads (the tokenizer is the target's), :func:`write_quantized`
at a quant type (through llama.cpp's quantizer); :func:`read_dflash_gguf` reads
one back, dequantized. :func:`read_target` and :func:`check_against_target`
say whether a drafter can serve a given target GGUF.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize

from localflash.archs import LAYER_INPUT_ARCHS
from localflash.errors import LocalflashError
from localflash.formats.gguf_write import add_decoder_keys, copy_tokenizer

QUANTS = ("Q4_K_M", "Q8_0", "F16", "F32")  # what a drafter GGUF can be written as
MASK_TOKEN_ID = 31999  # the default mask token: a rare piece of the bundled SPM vocab stands in for <|MASK|>
F32_ONLY = ("_conv_base",)  # DFlash2 convolution bases: added to F32 activations, never halved or quantized
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")  # dflash.* keys of DFlash2
_YARN_KEYS = (  # HF rope_scaling name -> dflash.rope.scaling.* key
    ("extrapolation_factor", "yarn_ext_factor"),
    ("attention_factor", "yarn_attn_factor"),
    ("beta_fast", "yarn_beta_fast"),
    ("beta_slow", "yarn_beta_slow"),
)


@dataclass
class DFlashSpec:
    """A DFlash drafter's shape and settings, in llama.cpp's conventions, for a target of width ``n_embd``.

    ``target_layers`` are in llama.cpp's layer-input convention (HF id + 1).
    ``swa_layers`` marks sliding-window layers (causal + window).
    """

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int | None = None
    target_layers: list[int] = field(default_factory=lambda: [1, 2])
    block_size: int = 16
    mask_token_id: int = MASK_TOKEN_ID
    rope_theta: float = 10000.0
    swa_window: int = 0
    swa_layers: list[bool] | None = None
    seed: int = 1
    n_ctx_train: int = 4096
    rms_eps: float = 1e-6
    causal: bool | None = None  # written as dflash.attention.causal when set (llama.cpp: one flag for all layers)
    key_length: int | None = None  # head_dim when it is not n_embd // n_head
    rope_scaling: dict | None = None  # HF rope_scaling ("linear" or "yarn"), written as rope.scaling.* keys
    embedding_scale: float = 0.0  # > 0: the block's token embeddings are multiplied by it (dflash.embedding_scale)

    @property
    def head_dim(self) -> int:
        return self.key_length or self.n_embd // self.n_head

    @property
    def ff(self) -> int:
        return self.n_ff or 4 * self.n_embd


@dataclass
class DFlash2Spec(DFlashSpec):
    """A DFlash2 drafter: DFlashSpec plus the two-tap dynamic convolution and the top-k selector.

    Tensors and keys follow the DFlash2 branch of ``src/models/dflash.cpp``:
    per layer ``attn_conv_base``/``ffn_conv_base`` ``[2, kernel, n_embd]`` and
    ``attn_conv_proj``/``ffn_conv_proj`` ``[2 * kernel * groups, n_embd]``;
    ``selector_predecessor``/``selector_successor`` ``[n_vocab, rank]`` and
    ``selector_hidden`` ``[rank, n_embd]``. ``omit_keys`` drops the
    conv/selector metadata (a broken file, for the error path).
    """

    block_size: int = 8
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 16
    selector_top_k: int = 4
    selector_scale: float = 0.5  # random-weight fixtures: std of the codebooks (how much the pairwise score reorders the top-k)
    omit_keys: bool = False

    def dflash2_keys(self) -> dict[str, int]:
        if self.omit_keys:
            return {}
        return {key: getattr(self, key) for key in DFLASH2_KEYS}


@dataclass
class DSparkSpec(DFlashSpec):
    """A DSpark drafter: DFlashSpec plus the Markov head and (``confidence``) the confidence head.

    Tensors follow ``src/models/dflash.cpp``: ``markov_w1`` and ``markov_w2``
    ``[n_vocab, markov_rank]`` (NumPy order), ``conf_proj`` ``[1, n_embd + markov_rank]``
    and its bias ``[1]``. Keys: ``dflash.sample_from_anchor`` (anchor-first block,
    llama.cpp's default when absent) and ``dflash.has_confidence_head``; ``None``
    leaves a key out. ``dsv4_hc`` > 0 writes ``dflash.hyper_connection.count`` (a
    DeepSeek-V4-backbone header, for the refusal path; its tensors are not written).
    """

    block_size: int = 8
    markov_rank: int = 16
    confidence: bool = True
    sample_from_anchor: bool | None = True
    has_confidence_key: bool | None = None  # None: written as ``confidence``
    markov_scale: float = 0.5  # random-weight fixtures: std of w1 and w2 (how much the Markov bias reorders the logits)
    conf_bias: float = 0.0  # random-weight fixtures: the confidence logit's bias (0: confidences around 0.5)
    dsv4_hc: int = 0

    def dspark_keys(self) -> dict[str, bool | int]:
        keys: dict[str, bool | int] = {}
        if self.sample_from_anchor is not None:
            keys["sample_from_anchor"] = bool(self.sample_from_anchor)
        conf = self.confidence if self.has_confidence_key is None else self.has_confidence_key
        if conf is not None:
            keys["has_confidence_head"] = bool(conf)
        if self.dsv4_hc:
            keys["hyper_connection.count"] = int(self.dsv4_hc)
        return keys


@dataclass
class LazyTensor:
    """A tensor known by shape, loaded only when written (``integer``: int64, e.g. ``d2t``)."""

    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    integer: bool = False


@dataclass
class DrafterInfo:
    """What a drafter needs from outside its tensors (target shape, vocabulary)."""

    spec: DFlashSpec
    vocab_size: int
    n_target_layers: int | None
    draft_vocab_size: int | None = None  # set when the drafter ships its own (reduced) head


def write_dflash_gguf(
    path: str | Path,
    spec: DFlashSpec,
    tensors: dict[str, "np.ndarray | LazyTensor"],
    tokenizer_from: str | Path,
    float_type: str = "F32",
    name: str | None = None,
    n_target_layers: int | None = None,
) -> Path:
    """Write a ``dflash`` GGUF with the keys llama.cpp's loader reads, its tokenizer copied from ``tokenizer_from``.

    ``tensors`` maps GGUF names to arrays in NumPy (row-major) shape, or to
    :class:`LazyTensor` loaders; they are streamed to disk one at a time, so a
    multi-GB drafter never sits in memory whole. Integer arrays
    (``d2t``) keep their type, 1-D float arrays are written F32 and matrices
    as ``float_type`` (``F32`` or ``F16``). ``n_target_layers`` (the target's
    depth, kept for the reverse conversion) is a localflash key llama.cpp ignores.
    """
    if float_type not in ("F32", "F16"):
        raise ValueError(f"float_type is F32 or F16, not {float_type}")
    path = Path(path)
    w = GGUFWriter(str(path), "dflash")
    w.add_name(name or f"dflash-{spec.n_embd}x{spec.n_layer}")
    copy_tokenizer(w, tokenizer_from, skip=("tokenizer.ggml.mask_token_id",))
    w.add_uint32("tokenizer.ggml.mask_token_id", spec.mask_token_id)
    add_decoder_keys(w, n_ctx_train=spec.n_ctx_train, n_embd=spec.n_embd, n_block=spec.n_layer, n_ff=spec.ff,
                     n_head=spec.n_head, n_head_kv=spec.n_head_kv, head_dim=spec.head_dim, rms_eps=spec.rms_eps,
                     rope_theta=spec.rope_theta)
    if spec.rope_scaling:
        _add_rope_scaling(w, spec.rope_scaling)
    w.add_array("dflash.target_layers", [int(x) for x in spec.target_layers])
    w.add_uint32("dflash.block_size", spec.block_size)
    if spec.swa_window:
        w.add_sliding_window(spec.swa_window)
        pattern = spec.swa_layers or [True] * spec.n_layer
        w.add_array("dflash.attention.sliding_window_pattern", [bool(x) for x in pattern])
    if spec.causal is not None:
        w.add_causal_attention(bool(spec.causal))
    if spec.embedding_scale:
        w.add_float32("dflash.embedding_scale", float(spec.embedding_scale))
    if n_target_layers is not None:
        w.add_uint32("dflash.n_target_layers", int(n_target_layers))
    for key, value in (spec.dflash2_keys() if isinstance(spec, DFlash2Spec) else {}).items():
        w.add_uint32(f"dflash.{key}", int(value))
    for key, value in (spec.dspark_keys() if isinstance(spec, DSparkSpec) else {}).items():
        (w.add_bool if isinstance(value, bool) else w.add_uint32)(f"dflash.{key}", value)
    w.add_file_type(1 if float_type == "F16" else 0)

    def load(name: str) -> np.ndarray:
        value = tensors[name]
        arr = np.asarray(value.load() if isinstance(value, LazyTensor) else value)
        if arr.dtype.kind in "iu":
            return np.ascontiguousarray(arr, dtype=np.int64 if isinstance(value, LazyTensor) else arr.dtype)
        dtype = np.float16 if float_type == "F16" and arr.ndim >= 2 and not name.endswith(F32_ONLY) else np.float32
        return np.ascontiguousarray(arr, dtype=dtype)

    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for tname, value in tensors.items():
        if isinstance(value, LazyTensor):
            shape, kind = tuple(value.shape), (np.dtype(np.int64) if value.integer else None)
        else:
            value = np.asarray(value)
            shape, kind = value.shape, (value.dtype if value.dtype.kind in "iu" else None)
        half = float_type == "F16" and len(shape) >= 2 and not tname.endswith(F32_ONLY)
        dtype = kind or np.dtype(np.float16 if half else np.float32)
        shapes[tname] = (tuple(shape), dtype)
        w.add_tensor_info(tname, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname in tensors:
        arr = load(tname)
        if (arr.shape, arr.dtype) != shapes[tname]:
            raise ValueError(f"tensor {tname} changed shape or type between passes")
        w.write_tensor_data(arr)
    w.close()
    return path


def write_quantized(
    out: str | Path,
    spec: DFlashSpec,
    tensors: dict,
    tokenizer_from: str | Path,
    quant: str,
    name: str | None = None,
    n_target_layers: int | None = None,
    n_params: int | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Path:
    """Write a ``dflash`` GGUF at ``quant``: F32/F16 directly, else a float file quantized by llama.cpp."""
    quant = quant.upper()
    if quant not in QUANTS:
        raise LocalflashError(f"unknown quantization {quant!r}", hint=f"use one of {', '.join(QUANTS)}")
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    direct = quant in ("F32", "F16")
    if n_params is None:
        n_params = sum(int(np.prod(v.shape)) for v in tensors.values())
    float_type = quant if direct else ("F32" if n_params * 4 < 2 << 30 else "F16")
    tmp = out if direct else out.with_name(out.name + f".{float_type.lower()}.tmp")
    if on_stage:
        on_stage(f"writing {float_type} GGUF")
    try:
        write_dflash_gguf(tmp, spec, tensors, tokenizer_from=tokenizer_from, float_type=float_type,
                          name=name, n_target_layers=n_target_layers)
        if not direct:
            from localflash.llama.quantize import quantize

            if on_stage:
                on_stage(f"quantizing to {quant}")
            quantize(tmp, out, quant)
    finally:
        if not direct and tmp.exists():
            tmp.unlink()
    return out


def _add_rope_scaling(w: GGUFWriter, scaling: dict) -> None:
    kind = scaling.get("rope_type") or scaling.get("type")
    factor = scaling.get("factor")
    if kind not in ("linear", "yarn") or factor is None:
        raise ValueError(f"rope scaling {kind!r} is not supported (linear and yarn are)")
    w.add_string("dflash.rope.scaling.type", kind)
    w.add_float32("dflash.rope.scaling.factor", float(factor))
    if kind == "yarn":
        w.add_uint32("dflash.rope.scaling.original_context_length", int(scaling["original_max_position_embeddings"]))
        for key, gguf_key in _YARN_KEYS:
            if scaling.get(key) is not None:
                w.add_float32(f"dflash.rope.scaling.{gguf_key}", float(scaling[key]))


def read_dflash_gguf(path: str | Path) -> tuple[DrafterInfo, dict[str, np.ndarray]]:
    """Spec and tensors (float32, dequantized; ``d2t`` as int64 target ids) of a ``dflash`` GGUF."""
    from localflash.llama.runtime import check_gguf

    p = check_gguf(path)
    r = GGUFReader(str(p))

    def val(key, default=None):
        f = r.fields.get(key)
        v = f.contents() if f is not None else default
        return float(f"{v:.7g}") if isinstance(v, float) else v  # float32 keys: drop the binary tail

    arch = val("general.architecture")
    if arch != "dflash":
        raise LocalflashError(f"{p.name} is a {arch!r} model, not a DFlash drafter")
    a = "dflash"
    n_layer = int(val(f"{a}.block_count"))
    pattern = val(f"{a}.attention.sliding_window_pattern")
    window = int(val(f"{a}.attention.sliding_window", 0) or 0)
    scaling = None
    if (kind := val(f"{a}.rope.scaling.type")) in ("linear", "yarn"):
        scaling = {"rope_type": kind, "factor": float(val(f"{a}.rope.scaling.factor"))}
        if kind == "yarn":
            scaling["original_max_position_embeddings"] = int(val(f"{a}.rope.scaling.original_context_length"))
            for hf_key, g in _YARN_KEYS:
                if (v := val(f"{a}.rope.scaling.{g}")) is not None:
                    scaling[hf_key] = float(v)
    n_embd = int(val(f"{a}.embedding_length"))
    n_head = int(val(f"{a}.attention.head_count"))
    head_dim = int(val(f"{a}.attention.key_length", n_embd // n_head))
    causal = val(f"{a}.attention.causal")
    dflash2 = {k: int(val(f"{a}.{k}")) for k in DFLASH2_KEYS if val(f"{a}.{k}") is not None}
    spec = (DFlash2Spec if dflash2 else DFlashSpec)(
        **dflash2,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=int(val(f"{a}.attention.head_count_kv", n_head)),
        n_ff=int(val(f"{a}.feed_forward_length")),
        target_layers=[int(x) for x in val(f"{a}.target_layers", [])],
        block_size=int(val(f"{a}.block_size", 16)),
        mask_token_id=int(val("tokenizer.ggml.mask_token_id", -1)),
        rope_theta=float(val(f"{a}.rope.freq_base", 10000.0)),
        swa_window=window,
        swa_layers=[bool(x) for x in pattern] if window and pattern is not None else None,
        n_ctx_train=int(val(f"{a}.context_length", 4096)),
        rms_eps=float(val(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        causal=None if causal is None else bool(causal),
        key_length=head_dim if head_dim != n_embd // n_head else None,
        rope_scaling=scaling,
        embedding_scale=float(val(f"{a}.embedding_scale", 0.0) or 0.0),
    )
    tensors: dict[str, np.ndarray] = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.I64, GGMLQuantizationType.I32):
            arr = np.asarray(t.data).reshape(shape)
            arr = arr.astype(np.int64) if arr.dtype.kind in "iu" else arr.astype(np.float32)
        else:
            arr = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
        tensors[t.name] = arr
    tokens = r.fields.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens.data) if tokens is not None else 0
    n_target = val("dflash.n_target_layers")
    d2t = tensors.get("d2t")
    info = DrafterInfo(spec, n_vocab, None if n_target is None else int(n_target), int(d2t.size) if d2t is not None else None)
    return info, tensors


@dataclass
class TargetInfo:
    path: Path
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int


def read_target(path: str | Path) -> TargetInfo:
    """The target's arch, depth, width and vocabulary, from its GGUF header."""
    from localflash.llama.runtime import check_gguf

    p = check_gguf(path)
    try:
        r = GGUFReader(str(p))
    except Exception as e:  # a truncated or foreign file
        raise LocalflashError(f"could not read {p.name} as GGUF ({e})") from e

    def val(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    arch = val("general.architecture", "?")
    n_layer = val(f"{arch}.block_count")
    n_embd = val(f"{arch}.embedding_length")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    if n_layer is None or n_embd is None or tokens is None:
        raise LocalflashError(f"{p.name} lacks {arch}.block_count, embedding_length or a tokenizer", hint="--target must be the target model's GGUF")
    if arch == "dflash":
        raise LocalflashError(f"{p.name} is itself a DFlash drafter", hint="--target is the model the drafter speeds up")
    return TargetInfo(p, arch, int(n_layer), int(n_embd), len(tokens.data))


def check_against_target(info: DrafterInfo, target: TargetInfo, fc_in: int | None = None) -> None:
    """Fail with one line when the drafter cannot serve ``target``."""
    s = info.spec
    name = target.path.name
    if target.arch not in LAYER_INPUT_ARCHS:
        raise LocalflashError(f"target arch {target.arch!r} cannot export layer inputs, which DFlash needs")
    if s.n_embd != target.n_embd:
        raise LocalflashError(f"drafter hidden size {s.n_embd} differs from {name}'s {target.n_embd}", hint="this drafter was made for another target")
    if fc_in is not None and fc_in != len(s.target_layers) * target.n_embd:
        raise LocalflashError(
            f"fc takes {fc_in} features but {len(s.target_layers)} taps of {name} give {len(s.target_layers) * target.n_embd}",
            hint="this drafter was made for another target",
        )
    if info.n_target_layers is not None and info.n_target_layers != target.n_layer:
        raise LocalflashError(
            f"drafter was trained on a {info.n_target_layers}-layer target but {name} has {target.n_layer} layers",
            hint="this drafter was made for another target",
        )
    deepest = max(s.target_layers)
    if deepest >= target.n_layer or min(s.target_layers) < 1:
        raise LocalflashError(
            f"drafter taps target layer {deepest - 1} (layer input {deepest}) but {name} has {target.n_layer} layers",
            hint="this drafter was made for a deeper target",
        )
    if info.vocab_size and info.vocab_size != target.n_vocab:
        raise LocalflashError(f"drafter vocabulary ({info.vocab_size}) differs from {name}'s ({target.n_vocab})", hint="this drafter was made for another target")
    if not 0 <= s.mask_token_id < target.n_vocab:
        raise LocalflashError(f"mask token {s.mask_token_id} is outside {name}'s vocabulary of {target.n_vocab}")
