"""Tiny random-weight GGUF files for tests, benchmarks and device checks.

Every file carries a real tokenizer (llama.cpp's SentencePiece vocab from the
0.3.36 sdist, MIT) so text goes in and out as usual. Weights are deterministic
by seed; a drafter made from the target's seed plus Gaussian ``noise`` agrees
with the target more or less often (0 noise: always, 0.6: rarely).

Architectures: ``llama`` and ``qwen3`` targets (both export layer inputs, so
DFlash can tap them) and ``dflash`` drafters whose tensors and keys follow
``src/models/dflash.cpp`` of the vendored llama.cpp; ``qwen35`` and
``qwen3next`` hybrids (Gated-DeltaNet + full attention, optionally with an
MTP "nextn" block) by :func:`write_hybrid`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MASK_TOKEN_ID = 31999
F32_ONLY = ("_conv_base",)  # DFlash2 convolution bases: added to F32 activations, never halved or quantized  # a rare piece of the SPM vocab stands in for <|MASK|>
_NOISE_SEED = 12345


def vocab_path() -> Path:
    return Path(str(resources.files("localflash") / "data" / "ggml-vocab-llama-spm.gguf"))


@dataclass
class TinySpec:
    """Shape of a tiny decoder. ``arch`` is ``llama`` or ``qwen3``."""

    arch: str = "llama"
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int | None = None
    n_ctx_train: int = 4096
    seed: int = 0
    noise: float = 0.0
    rename_tokens: bool = False  # write a vocab whose token strings differ (incompatible pair)
    layer_scale: float = 0.02  # std of the layer matrices; larger makes each layer change the residual more

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ff(self) -> int:
        return self.n_ff or 4 * self.n_embd


@dataclass
class DFlashSpec:
    """A tiny DFlash drafter for a target of width ``n_embd``.

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
class LazyTensor:
    """A tensor known by shape, loaded only when written (``integer``: int64, e.g. ``d2t``)."""

    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    integer: bool = False


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
        if kind == GGUFValueType.ARRAY:
            writer.add_array(name, value)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, value)
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(name, value)
        elif kind == GGUFValueType.UINT32:
            writer.add_uint32(name, value)
        elif kind == GGUFValueType.INT32:
            writer.add_int32(name, value)
        elif kind == GGUFValueType.FLOAT32:
            writer.add_float32(name, value)
        else:
            raise ValueError(f"unsupported tokenizer field type {kind} for {name}")
    return n_vocab


class _Weights:
    """Deterministic weights: base from ``seed``, plus ``noise`` from a fixed stream."""

    def __init__(self, seed: int, noise: float):
        self.rng = np.random.default_rng(seed)
        self.nrng = np.random.default_rng(_NOISE_SEED)
        self.noise = noise

    def __call__(self, shape: tuple[int, ...], scale: float) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        if self.noise:
            w = w + self.noise * self.nrng.standard_normal(shape, dtype=np.float32)
        return (w * scale).astype(np.float32)


def write_target(path: str | Path, spec: TinySpec | None = None, **kw) -> Path:
    """Write a tiny ``llama`` or ``qwen3`` model with random F32 weights."""
    spec = spec or TinySpec(**kw)
    path = Path(path)
    arch = spec.arch
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{spec.n_embd}x{spec.n_layer}-s{spec.seed}")
    n_vocab = copy_tokenizer(w, vocab_path(), spec.rename_tokens)
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # ALL_F32
    if arch == "llama":
        w.add_rope_dimension_count(spec.head_dim)
    elif arch == "qwen3":
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        w.add_rope_freq_base(1e6)
    else:
        raise ValueError(f"tiny targets are llama or qwen3, not {arch}")

    rand = _Weights(spec.seed, spec.noise)
    d, hd = spec.n_embd, spec.head_dim
    w.add_tensor("token_embd.weight", rand((n_vocab, d), 1.0))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.add_tensor("output.weight", rand((n_vocab, d), 0.5))
    for i in range(spec.n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand((spec.n_head * hd, d), spec.layer_scale))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand((spec.n_head_kv * hd, d), spec.layer_scale))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand((spec.n_head_kv * hd, d), spec.layer_scale))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand((d, spec.n_head * hd), spec.layer_scale))
        if arch == "qwen3":
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(hd, np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(hd, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand((spec.ff, d), spec.layer_scale))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand((spec.ff, d), spec.layer_scale))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand((d, spec.ff), spec.layer_scale))
    _finish(w)
    return path


def dflash_tensors(spec: DFlashSpec) -> dict[str, np.ndarray]:
    """Random DFlash drafter weights under their GGUF names (NumPy shapes, row-major)."""
    rand = _Weights(spec.seed, 0.0)
    d, hd = spec.n_embd, spec.head_dim
    n_feat = len(spec.target_layers) * d
    t: dict[str, np.ndarray] = {
        "fc.weight": rand((d, n_feat), 1.0 / np.sqrt(n_feat)),
        "enc.output_norm.weight": np.ones(d, np.float32),
        "output_norm.weight": np.ones(d, np.float32),
    }
    for i in range(spec.n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(d, np.float32)
        t[f"blk.{i}.attn_q.weight"] = rand((spec.n_head * hd, d), 0.1)
        t[f"blk.{i}.attn_k.weight"] = rand((spec.n_head_kv * hd, d), 0.1)
        t[f"blk.{i}.attn_v.weight"] = rand((spec.n_head_kv * hd, d), 0.1)
        t[f"blk.{i}.attn_output.weight"] = rand((d, spec.n_head * hd), 0.1)
        t[f"blk.{i}.attn_q_norm.weight"] = np.ones(hd, np.float32)
        t[f"blk.{i}.attn_k_norm.weight"] = np.ones(hd, np.float32)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(d, np.float32)
        t[f"blk.{i}.ffn_gate.weight"] = rand((spec.ff, d), 0.1)
        t[f"blk.{i}.ffn_up.weight"] = rand((spec.ff, d), 0.1)
        t[f"blk.{i}.ffn_down.weight"] = rand((d, spec.ff), 0.1)
    return t


def write_dflash_gguf(
    path: str | Path,
    spec: DFlashSpec,
    tensors: dict[str, "np.ndarray | LazyTensor"],
    tokenizer_from: str | Path | None = None,
    float_type: str = "F32",
    name: str | None = None,
    n_target_layers: int | None = None,
) -> Path:
    """Write a ``dflash`` GGUF with the keys llama.cpp's loader reads.

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
    copy_tokenizer(w, tokenizer_from or vocab_path(), skip=("tokenizer.ggml.mask_token_id",))
    w.add_uint32("tokenizer.ggml.mask_token_id", spec.mask_token_id)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_freq_base(spec.rope_theta)
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
    for key, value in getattr(spec, "dflash2_keys", lambda: {})().items():
        w.add_uint32(f"dflash.{key}", int(value))
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


def _add_rope_scaling(w: GGUFWriter, scaling: dict) -> None:
    kind = scaling.get("rope_type") or scaling.get("type")
    factor = scaling.get("factor")
    if kind not in ("linear", "yarn") or factor is None:
        raise ValueError(f"rope scaling {kind!r} is not supported (linear and yarn are)")
    w.add_string("dflash.rope.scaling.type", kind)
    w.add_float32("dflash.rope.scaling.factor", float(factor))
    if kind == "yarn":
        w.add_uint32("dflash.rope.scaling.original_context_length", int(scaling["original_max_position_embeddings"]))
        for key, gguf_key in (
            ("extrapolation_factor", "yarn_ext_factor"),
            ("attention_factor", "yarn_attn_factor"),
            ("beta_fast", "yarn_beta_fast"),
            ("beta_slow", "yarn_beta_slow"),
        ):
            if scaling.get(key) is not None:
                w.add_float32(f"dflash.rope.scaling.{gguf_key}", float(scaling[key]))


def write_dflash(path: str | Path, spec: DFlashSpec | None = None, **kw) -> Path:
    """Write a tiny random DFlash drafter (borrows the target's embedding and head)."""
    spec = spec or DFlashSpec(**kw)
    return write_dflash_gguf(path, spec, dflash_tensors(spec))


@dataclass
class DFlash2Spec(DFlashSpec):
    """A tiny DFlash2 drafter: DFlashSpec plus the two-tap dynamic convolution and the top-k selector.

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
    selector_scale: float = 0.5  # std of the codebooks: how much the pairwise score reorders the top-k
    omit_keys: bool = False

    def dflash2_keys(self) -> dict[str, int]:
        if self.omit_keys:
            return {}
        return {
            "conv_kernel_size": self.conv_kernel_size,
            "conv_group_size": self.conv_group_size,
            "selector_rank": self.selector_rank,
            "selector_top_k": self.selector_top_k,
        }


def dflash2_tensors(spec: DFlash2Spec, n_vocab: int = 32000) -> dict[str, np.ndarray]:
    """Random DFlash2 weights: the DFlash ones plus convolutions and selector."""
    t = dflash_tensors(spec)
    rand = _Weights(spec.seed + 1000, 0.0)
    d, kernel = spec.n_embd, spec.conv_kernel_size
    projected = 2 * kernel * (d // spec.conv_group_size)
    for i in range(spec.n_layer):
        for part in ("attn", "ffn"):
            base = np.zeros((2, kernel, d), np.float32)
            base[:, 0, :] = 1.0  # tap 0 (the position itself) passes through; the others mix in neighbours
            t[f"blk.{i}.{part}_conv_base"] = base + rand((2, kernel, d), 0.1)
            t[f"blk.{i}.{part}_conv_proj.weight"] = rand((projected, d), 0.05)
    t["selector_predecessor.weight"] = rand((n_vocab, spec.selector_rank), spec.selector_scale)
    t["selector_successor.weight"] = rand((n_vocab, spec.selector_rank), spec.selector_scale)
    t["selector_hidden.weight"] = rand((spec.selector_rank, d), 1.0 / np.sqrt(d))
    return t


def write_dflash2(path: str | Path, spec: DFlash2Spec | None = None, **kw) -> Path:
    """Write a tiny random DFlash2 drafter (borrows the target's embedding and head)."""
    spec = spec or DFlash2Spec(**kw)
    return write_dflash_gguf(path, spec, dflash2_tensors(spec), name=f"dflash2-{spec.n_embd}x{spec.n_layer}")


@dataclass
class Eagle3Spec:
    """A tiny EAGLE-3 drafter (arch ``eagle3``, ``src/models/eagle3.cpp``): fc over three tapped
    target layers, one decoder layer on ``[norm(token embedding), norm(g)]``.

    ``target_layers`` are layer-input ids of the target (llama.cpp's convention).
    ``draft_vocab`` > 0 gives the drafter its own head over that many target ids
    (``d2t``: every ``vocab_stride``-th id) and, with ``own_embeddings``, its own
    token embedding, so it needs nothing of the target's weights. ``echo`` > 0
    writes a drafter that is often right on a tiny target: its attention copies
    the current token's normalised embedding (query = key = ``echo`` x that
    embedding, value = it), the feed-forward is zero and ``fc_scale`` sets how
    much of the fused target features is added (0.3: mostly right, 1: mostly not).
    """

    n_embd: int = 64
    target_hidden_size: int = 64
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int | None = None
    target_layers: list[int] = field(default_factory=lambda: [1, 2, 3])
    draft_vocab: int = 0
    vocab_stride: int = 4
    own_embeddings: bool = False
    echo: float = 0.0
    fc_scale: float = 1.0
    norm_before_residual: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    n_ctx_train: int = 4096
    seed: int = 2

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ff(self) -> int:
        return self.n_ff or 4 * self.n_embd


def eagle3_tensors(spec: Eagle3Spec, n_vocab: int = 32000) -> dict[str, np.ndarray]:
    """Random (or echoing) EAGLE-3 weights under their GGUF names (NumPy shapes, row-major)."""
    rand = _Weights(spec.seed, 0.0)
    d, hd = spec.n_embd, spec.head_dim
    n_feat = len(spec.target_layers) * spec.target_hidden_size
    q_out, kv_out = spec.n_head * hd, spec.n_head_kv * hd
    t: dict[str, np.ndarray] = {
        "fc.weight": rand((d, n_feat), spec.fc_scale / np.sqrt(n_feat)),
        "output_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_norm_2.weight": np.ones(d, np.float32),
        "blk.0.ffn_norm.weight": np.ones(d, np.float32),
    }
    if spec.echo:
        pick = np.zeros((d, 2 * d), np.float32)
        pick[:, :d] = np.eye(d, dtype=np.float32)  # the token-embedding half of the concatenated input
        t["blk.0.attn_q.weight"] = spec.echo * pick[:q_out]
        t["blk.0.attn_k.weight"] = spec.echo * pick[:kv_out]
        t["blk.0.attn_v.weight"] = pick[:kv_out]
        t["blk.0.attn_output.weight"] = np.eye(d, q_out, dtype=np.float32)
        for name, shape in (("gate", (spec.ff, d)), ("up", (spec.ff, d)), ("down", (d, spec.ff))):
            t[f"blk.0.ffn_{name}.weight"] = np.zeros(shape, np.float32)
    else:
        t["blk.0.attn_q.weight"] = rand((q_out, 2 * d), 0.1)
        t["blk.0.attn_k.weight"] = rand((kv_out, 2 * d), 0.1)
        t["blk.0.attn_v.weight"] = rand((kv_out, 2 * d), 0.1)
        t["blk.0.attn_output.weight"] = rand((d, q_out), 0.1)
        t["blk.0.ffn_gate.weight"] = rand((spec.ff, d), 0.1)
        t["blk.0.ffn_up.weight"] = rand((spec.ff, d), 0.1)
        t["blk.0.ffn_down.weight"] = rand((d, spec.ff), 0.1)
    if spec.draft_vocab:
        t["d2t"] = (np.arange(spec.draft_vocab, dtype=np.int64) * spec.vocab_stride) % n_vocab
        t["output.weight"] = rand((spec.draft_vocab, d), 0.5)
    if spec.own_embeddings:
        t["token_embd.weight"] = rand((n_vocab, d), 1.0)
    return t


def write_eagle3(path: str | Path, spec: Eagle3Spec | None = None, omit: tuple[str, ...] = (), **kw) -> Path:
    """Write a tiny EAGLE-3 drafter; ``omit`` leaves out metadata keys (for the error paths)."""
    spec = spec or Eagle3Spec(**kw)
    path = Path(path)
    w = GGUFWriter(str(path), "eagle3")
    w.add_name(f"eagle3-{spec.n_embd}")
    n_vocab = copy_tokenizer(w, vocab_path())
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(spec.ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_vocab_size(n_vocab)
    if "target_layers" not in omit:
        w.add_array("eagle3.target_layers", [int(x) for x in spec.target_layers])
    if "target_hidden_size" not in omit:
        w.add_uint32("eagle3.target_hidden_size", spec.target_hidden_size)
    w.add_bool("eagle3.norm_before_residual", spec.norm_before_residual)
    w.add_file_type(0)
    for name, arr in eagle3_tensors(spec, n_vocab).items():
        w.add_tensor(name, arr)
    _finish(w)
    return path


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@dataclass
class HybridSpec:
    """A tiny Gated-DeltaNet hybrid: ``qwen35`` (dense) or ``qwen3next`` (MoE FFN).

    Every ``full_attention_interval``-th block is full attention, the others are
    linear attention (llama.cpp: ``(il + 1) % interval != 0`` is recurrent).
    ``n_nextn`` > 0 appends MTP ("nextn") blocks after the trunk, as the real
    Qwen3.5/3.6 GGUFs do (``blk.{n_layer}.nextn.*``, ``<arch>.nextn_predict_layers``).
    """

    arch: str = "qwen35"
    n_embd: int = 64
    n_layer: int = 6
    full_attention_interval: int = 3
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_rot: int = 8  # partial rotary (Qwen3.5: a quarter of head_dim)
    linear_k_heads: int = 2
    linear_v_heads: int = 4
    linear_head_dim: int = 16
    conv_kernel: int = 4
    n_ff: int = 128
    n_nextn: int = 0
    # None: a random eh_proj. A number s: eh_proj = [I | s * random], so the MTP block mostly repeats the
    # trunk's next-token guess from the token embedding (its drafts are often accepted) and reads h a little
    mtp_agree: float | None = None
    n_expert: int = 4  # qwen3next only
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ctx_train: int = 4096
    seed: int = 0
    noise: float = 0.0
    # the recurrent state must matter: slow decay (exp(-exp(a_log) * softplus(dt)) per token), so that a
    # stale state changes the next tokens (tests catch a wrong rollback by that); weak layers keep the
    # text repetitive enough for n-gram lookup to draft
    layer_scale: float = 0.03
    a_log: float = -3.0  # mean log decay rate of the Gated-DeltaNet heads (lower: longer memory)
    dt_bias: float = -1.0

    def recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0


def write_hybrid(path: str | Path, spec: HybridSpec | None = None, **kw) -> Path:
    """Write a tiny ``qwen35`` / ``qwen3next`` model with random F32 weights (tensors as in ``src/models/<arch>.cpp``)."""
    spec = spec or HybridSpec(**kw)
    a = spec.arch
    if a not in ("qwen35", "qwen3next"):
        raise ValueError(f"tiny hybrids are qwen35 or qwen3next, not {a}")
    path = Path(path)
    w = GGUFWriter(str(path), a)
    w.add_name(f"tiny-{a}-{spec.n_embd}x{spec.n_layer}{f'-mtp{spec.n_nextn}' if spec.n_nextn else ''}-s{spec.seed}")
    n_vocab = copy_tokenizer(w, vocab_path())
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer + spec.n_nextn)
    if spec.n_nextn:
        w.add_uint32(f"{a}.nextn_predict_layers", spec.n_nextn)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(spec.n_rot)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)
    w.add_uint32(f"{a}.full_attention_interval", spec.full_attention_interval)
    w.add_uint32(f"{a}.ssm.conv_kernel", spec.conv_kernel)
    w.add_uint32(f"{a}.ssm.state_size", spec.linear_head_dim)
    w.add_uint32(f"{a}.ssm.group_count", spec.linear_k_heads)
    w.add_uint32(f"{a}.ssm.time_step_rank", spec.linear_v_heads)
    w.add_uint32(f"{a}.ssm.inner_size", spec.linear_head_dim * spec.linear_v_heads)
    if a == "qwen35":  # interleaved M-RoPE; the sections count rotary pairs
        half = spec.n_rot // 2
        w.add_array(f"{a}.rope.dimension_sections", [half - 2 * (half // 3), half // 3, half // 3, 0])
    else:
        w.add_uint32(f"{a}.expert_count", spec.n_expert)
        w.add_uint32(f"{a}.expert_used_count", spec.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", spec.n_ff_exp)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.n_ff)

    rand = _Weights(spec.seed, spec.noise)
    d, hd, s = spec.n_embd, spec.head_dim, spec.layer_scale
    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", rand((n_vocab, d), 1.0))
    w.add_tensor("output_norm.weight", ones(d))
    w.add_tensor("output.weight", rand((n_vocab, d), 0.5))
    key_dim = spec.linear_head_dim * spec.linear_k_heads
    value_dim = spec.linear_head_dim * spec.linear_v_heads
    conv_dim = 2 * key_dim + value_dim
    for il in range(spec.n_layer + spec.n_nextn):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", ones(d))
        w.add_tensor(b + "post_attention_norm.weight", ones(d))
        if spec.recurrent(il):
            w.add_tensor(b + "attn_qkv.weight", rand((conv_dim, d), s))
            w.add_tensor(b + "attn_gate.weight", rand((value_dim, d), s))
            w.add_tensor(b + "ssm_conv1d.weight", rand((conv_dim, spec.conv_kernel), 0.5))
            w.add_tensor(b + "ssm_dt.bias", rand((spec.linear_v_heads,), 0.5) + spec.dt_bias)
            w.add_tensor(b + "ssm_a", -np.exp(rand((spec.linear_v_heads,), 0.5) + spec.a_log))  # -exp(A_log)
            if a == "qwen35":
                w.add_tensor(b + "ssm_beta.weight", rand((spec.linear_v_heads, d), s))
                w.add_tensor(b + "ssm_alpha.weight", rand((spec.linear_v_heads, d), s))
            else:
                w.add_tensor(b + "ssm_ba.weight", rand((2 * spec.linear_v_heads, d), s))
            w.add_tensor(b + "ssm_norm.weight", ones(spec.linear_head_dim))
            w.add_tensor(b + "ssm_out.weight", rand((d, value_dim), s))
        else:  # full attention; the query projection also yields the output gate
            w.add_tensor(b + "attn_q.weight", rand((2 * spec.n_head * hd, d), s))
            w.add_tensor(b + "attn_k.weight", rand((spec.n_head_kv * hd, d), s))
            w.add_tensor(b + "attn_v.weight", rand((spec.n_head_kv * hd, d), s))
            w.add_tensor(b + "attn_output.weight", rand((d, spec.n_head * hd), s))
            w.add_tensor(b + "attn_q_norm.weight", ones(hd))
            w.add_tensor(b + "attn_k_norm.weight", ones(hd))
        if a == "qwen35":
            w.add_tensor(b + "ffn_gate.weight", rand((spec.n_ff, d), s))
            w.add_tensor(b + "ffn_up.weight", rand((spec.n_ff, d), s))
            w.add_tensor(b + "ffn_down.weight", rand((d, spec.n_ff), s))
        else:
            e, fe = spec.n_expert, spec.n_ff_exp
            w.add_tensor(b + "ffn_gate_inp.weight", rand((e, d), s))
            w.add_tensor(b + "ffn_gate_exps.weight", rand((e, fe, d), s))
            w.add_tensor(b + "ffn_up_exps.weight", rand((e, fe, d), s))
            w.add_tensor(b + "ffn_down_exps.weight", rand((e, d, fe), s))
            w.add_tensor(b + "ffn_gate_inp_shexp.weight", rand((d,), s))
            w.add_tensor(b + "ffn_gate_shexp.weight", rand((spec.n_ff, d), s))
            w.add_tensor(b + "ffn_up_shexp.weight", rand((spec.n_ff, d), s))
            w.add_tensor(b + "ffn_down_shexp.weight", rand((d, spec.n_ff), s))
        if il >= spec.n_layer:  # MTP block: embedding and hidden state joined by eh_proj
            if spec.mtp_agree is None:
                eh_proj = rand((d, 2 * d), 1.0 / np.sqrt(2 * d))
            else:
                eh_proj = np.concatenate([np.eye(d, dtype=np.float32), rand((d, d), spec.mtp_agree / np.sqrt(d))], axis=1)
            w.add_tensor(b + "nextn.eh_proj.weight", eh_proj)
            w.add_tensor(b + "nextn.enorm.weight", ones(d))
            w.add_tensor(b + "nextn.hnorm.weight", ones(d))
            w.add_tensor(b + "nextn.shared_head_norm.weight", ones(d))
    _finish(w)
    return path
