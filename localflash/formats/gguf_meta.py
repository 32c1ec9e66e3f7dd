"""What a GGUF file costs in memory, read from its header only (no weights are loaded).

``read_meta(path)`` returns a ``ModelMeta``: the architecture numbers the KV
cache and compute buffers depend on (layers, widths, heads, head dims, sliding
windows, recurrent-state sizes of hybrid models, experts, vocabulary) and the
bytes of every tensor grouped the way llama.cpp places them: the input layer
(token embedding, kept on the host), each repeating block ``blk.N``, and the
output layer (``output``, ``output_norm`` and any other non-block tensor,
placed like block ``n_layer_all``). Target models and drafters (``dflash``
drafters, small autoregressive drafts) are read alike.

Key names follow llama.cpp's ``src/llama-arch.cpp`` (``<arch>.block_count``,
``<arch>.attention.head_count_kv`` ...). Architectures whose layer layout is
not known here are still read: the KV cache is then derived from the shapes
of the ``attn_k``/``attn_v`` tensors and a warning says so.
"""

from __future__ import annotations

import functools
import mmap
import struct

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from localflash.archs import HYBRID_ARCHS, KNOWN_ARCHS, SWA_PATTERNS
from localflash.errors import LocalflashError
from localflash.formats.gguf_header import HeaderReader


INPUT_TENSORS = ("token_embd.", "token_types.", "position_embd.", "per_layer_token_embd.")
EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: ggml type name, shape in ggml order (ne0 first), bytes, block index (None outside blocks)."""

    name: str
    type: str
    shape: tuple[int, ...]
    n_bytes: int
    layer: int | None


@dataclass(frozen=True)
class KvLayer:
    """A block with a KV cache: its index, K and V row widths (elements), and whether it is sliding-window."""

    index: int
    n_embd_k: int
    n_embd_v: int
    swa: bool


@dataclass(frozen=True)
class SsmShape:
    """Gated-DeltaNet / Mamba state sizes (``<arch>.ssm.*``)."""

    d_conv: int
    d_inner: int
    d_state: int
    n_group: int
    dt_rank: int

    @property
    def row_floats(self) -> int:
        """f32 values of one sequence's state in one recurrent block: conv state + recurrent state."""
        conv = max(self.d_conv - 1, 0) * (self.d_inner + 2 * self.n_group * self.d_state)
        return conv + self.d_state * self.d_inner


@dataclass
class ModelMeta:
    path: Path
    arch: str
    name: str
    file_bytes: int
    n_layer: int  # blocks the graph runs (block_count minus nextn/MTP blocks)
    n_layer_nextn: int
    n_embd: int
    n_ff: int  # widest dense FFN
    n_vocab: int
    n_ctx_train: int
    n_head: list[int]
    n_head_kv: list[int]
    head_dim_k: int
    head_dim_v: int
    swa_window: int
    swa_layers: list[bool]
    recurrent_layers: list[bool]
    ssm: SsmShape | None
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    target_layers: list[int]
    block_size: int  # DFlash draft block (positions drafted per step); 0 for other models
    tensors: list[TensorInfo]
    warnings: list[str] = field(default_factory=list)
    selector_top_k: int = 0  # DFlash2: candidates per block position (0: DFlash1 or not a DFlash file)
    target_hidden_size: int = 0  # EAGLE-3: width of each tapped target layer
    is_dspark: bool = False  # a DFlash file with a Markov head (markov_w1)
    dspark_confidence: bool = False  # ... and a confidence head (conf_proj; dflash.has_confidence_head not false)
    sample_from_anchor: bool = True  # DSpark: an anchor-first block (dflash.sample_from_anchor, absent: true)
    dsv4_backbone: bool = False  # DSpark on a DeepSeek-V4 backbone (dflash.hyper_connection.count > 0)
    load_mtp: bool = False  # priced as loaded with its MTP/nextn blocks (``replace(meta, load_mtp=True)``)

    @property
    def n_layer_all(self) -> int:
        """Block slots llama.cpp places (the output layer counts as slot ``n_layer_all``)."""
        return self.n_layer + self.n_layer_nextn

    @property
    def known_arch(self) -> bool:
        return self.arch in KNOWN_ARCHS

    @property
    def is_hybrid(self) -> bool:
        return any(self.recurrent_layers)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_dflash(self) -> bool:
        return self.arch == "dflash"

    @property
    def is_eagle3(self) -> bool:
        return self.arch == "eagle3"

    @property
    def has_own_head(self) -> bool:
        """False for drafters that borrow the target's ``output`` (and ``token_embd``) through ``ctx_other``."""
        return any(t.name.startswith(("output.", "token_embd.")) for t in self.tensors)

    @property
    def n_embd_inp(self) -> int:
        """Width entering block 0: DFlash drafters take ``len(target_layers)`` target hidden states."""
        if self.is_eagle3:
            return len(self.target_layers) * self.target_hidden_size
        return len(self.target_layers) * self.n_embd if self.is_dflash else self.n_embd

    def loaded(self, t: TensorInfo) -> bool:
        """llama.cpp skips MTP/nextn block weights unless MTP drafting is on (``load_mtp``)."""
        return t.layer is None or t.layer < self.n_layer or self.load_mtp

    @property
    def input_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors if t.name.startswith(INPUT_TENSORS))

    @property
    def output_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors if t.layer is None and not t.name.startswith(INPUT_TENSORS))

    @property
    def tied_head_bytes(self) -> int:
        """Bytes of ``token_embd`` when it doubles as the LM head (no ``output.weight``): llama.cpp then
        loads a second copy on the output layer's device when that device is a GPU."""
        names = {t.name: t for t in self.tensors}
        if "output.weight" in names or "token_embd.weight" not in names:
            return 0
        return names["token_embd.weight"].n_bytes

    @property
    def layer_bytes(self) -> list[int]:
        """Loaded bytes per block slot, ``n_layer_all`` entries (nextn slots are 0 unless ``load_mtp``)."""
        out = [0] * self.n_layer_all
        for t in self.tensors:
            if t.layer is not None and self.loaded(t) and t.layer < len(out):
                out[t.layer] += t.n_bytes
        return out

    @property
    def expert_bytes(self) -> list[int]:
        """Bytes of ``ffn_*_exps`` tensors per block slot (the part a tensor override can keep on the host)."""
        out = [0] * self.n_layer_all
        for t in self.tensors:
            m = EXPERT_TENSOR.match(t.name)
            if m and self.loaded(t):
                out[int(m[1])] += t.n_bytes
        return out

    @property
    def weight_bytes(self) -> int:
        return self.input_bytes + sum(self.layer_bytes) + self.output_bytes

    @property
    def output_vocab(self) -> int:
        """Rows of the LM head used for logits (the target's vocab for head-sharing drafters)."""
        for t in self.tensors:
            if t.name in ("output.weight", "token_embd.weight"):
                return t.shape[1]
        return self.n_vocab

    def kv_layers(self) -> list[KvLayer]:
        """Blocks that own a KV cache in the main context (nextn/MTP blocks excluded)."""
        out = []
        for il in range(self.n_layer):
            if self.recurrent_layers[il]:
                continue
            hkv = self.n_head_kv[il]
            if hkv == 0:
                continue
            out.append(KvLayer(il, hkv * self.head_dim_k, hkv * self.head_dim_v, self.swa_layers[il]))
        return out

    @property
    def recurrent_row_bytes(self) -> int:
        """f32 state bytes of one sequence snapshot across all recurrent blocks."""
        if self.ssm is None:
            return 0
        return 4 * self.ssm.row_floats * sum(self.recurrent_layers[: self.n_layer])

    def largest_matmul_bytes(self, pattern: re.Pattern[str] | None = None) -> int:
        """Bytes of the largest 2-D/3-D weight (optionally only names matching ``pattern``)."""
        sizes = [t.n_bytes for t in self.tensors if len(t.shape) >= 2 and (pattern is None or pattern.search(t.name))]
        return max(sizes, default=0)


def tensor_bytes(ggml_type: int | str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of ``shape`` (ggml order) and type, from gguf's block tables."""
    qtype = GGMLQuantizationType[ggml_type.upper()] if isinstance(ggml_type, str) else GGMLQuantizationType(ggml_type)
    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape)) if len(shape) else 1
    if shape and shape[0] % block:
        raise ValueError(f"{qtype.name} rows need a multiple of {block} elements, got {shape[0]}")
    return n // block * size


def read_meta(path: str | Path) -> ModelMeta:
    """Parse a GGUF header into a ``ModelMeta``; raise ``LocalflashError`` for a missing or non-GGUF file.

    Results are cached per (path, size, mtime): parsing a large tokenizer takes seconds.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise LocalflashError(f"model file not found: {p}", hint="pass the path of a .gguf file")
    st = p.stat()
    return _read_meta_cached(p.absolute(), st.st_size, st.st_mtime_ns)  # not resolved: a cache snapshot keeps its name


@functools.lru_cache(maxsize=16)
def _read_meta_cached(p: Path, size: int, mtime_ns: int) -> ModelMeta:
    with p.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise LocalflashError(f"not a GGUF file: {p}", hint="localflash loads llama.cpp GGUF models (*.gguf)")
    try:
        readers = [_local_reader(p)]
        count = readers[0].fields.get("split.count")
        if count is not None and int(count.value) > 1:  # the first part of a split GGUF: the other parts' tensors too
            for other in split_paths(p.name, int(count.value))[1:]:
                q = p.with_name(other)
                if not q.is_file():
                    raise LocalflashError(f"{p.name} is part 1 of {int(count.value)}, but {other} is missing",
                                          hint="download every part into the same folder")
                readers.append(_local_reader(q))
        return meta_from_readers(p, readers, sum(r.file_bytes for r in readers))
    except (ValueError, OSError, IndexError, KeyError, struct.error) as e:
        raise LocalflashError(
            f"{p.name} is not a readable GGUF file (truncated or corrupt)",
            hint="download or convert it again; --verbose shows the parser's message",
        ) from e


def _local_reader(p: Path) -> HeaderReader:
    with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        r = HeaderReader(m, tensor_bytes)
        r.file_bytes = len(m)
        return r


_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_paths(name: str, count: int) -> list[str]:
    """The file names of every part of a split GGUF (llama.cpp's ``PREFIX-0000i-of-0000N.gguf``), given one."""
    m = _SPLIT.match(name)
    prefix = m[1] if m else name.removesuffix(".gguf")
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def meta_from_readers(path: Path, readers: list, file_bytes: int) -> ModelMeta:
    """A ``ModelMeta`` from the header(s) of one model: the first part's keys, every part's tensors."""
    if len(readers) > 1:
        first = readers[0]
        first.tensors = [t for r in readers for t in r.tensors]
    return _meta_from_reader(path, readers[0], file_bytes)


def _meta_from_reader(path: Path, reader, file_bytes: int) -> ModelMeta:
    fields = {name: f for name, f in reader.fields.items() if not name.startswith("tokenizer.ggml.merges")}

    def get(key: str, default=None):
        f = fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return v if v is not None else default

    arch = str(get("general.architecture", "unknown"))
    a = arch
    tensors = [
        TensorInfo(t.name, t.tensor_type.name, tuple(int(x) for x in t.shape), int(t.n_bytes), _block_of(t.name))
        for t in reader.tensors
    ]
    by_name = {t.name: t for t in tensors}
    warnings: list[str] = []

    n_layer_all = int(get(f"{a}.block_count", 0) or 0)
    if n_layer_all == 0:
        n_layer_all = 1 + max((t.layer for t in tensors if t.layer is not None), default=-1)
        warnings.append(f"{arch}: no {a}.block_count key; counted {n_layer_all} blocks from tensor names")
    n_nextn = int(get(f"{a}.nextn_predict_layers", 0) or 0)
    n_layer = n_layer_all - n_nextn
    n_embd = int(get(f"{a}.embedding_length", 0) or 0) or _width_from_tensors(by_name)
    n_head = _per_layer(get(f"{a}.attention.head_count", 0), n_layer_all)
    n_head_kv = _per_layer(get(f"{a}.attention.head_count_kv", None), n_layer_all, fallback=n_head)
    h0 = max(n_head) if n_head else 0
    head_dim_k = int(get(f"{a}.attention.key_length", 0) or 0) or (n_embd // h0 if h0 else 0)
    head_dim_v = int(get(f"{a}.attention.value_length", 0) or 0) or head_dim_k

    n_vocab = int(get(f"{a}.vocab_size", 0) or 0)
    if not n_vocab:
        tok = fields.get("tokenizer.ggml.tokens")
        n_vocab = len(tok.data) if tok is not None else 0
    if not n_vocab:
        head = by_name.get("output.weight") or by_name.get("token_embd.weight")
        n_vocab = head.shape[1] if head else 0

    ff = get(f"{a}.feed_forward_length", 0)
    n_ff = int(max(ff) if isinstance(ff, list) else ff or 0)

    swa_window = int(get(f"{a}.attention.sliding_window", 0) or 0)
    swa_layers = _swa_layers(arch, get(f"{a}.attention.sliding_window_pattern", None), swa_window, n_layer, n_layer_all)

    recurrent = [False] * n_layer_all
    ssm = None
    if arch in HYBRID_ARCHS:
        rec = get(f"{a}.attention.recurrent_layers", None)
        if isinstance(rec, list) and len(rec) >= n_layer:
            recurrent = [bool(x) and i < n_layer for i, x in enumerate(rec[:n_layer_all])] + [False] * max(0, n_layer_all - len(rec))
        else:
            interval = int(get(f"{a}.full_attention_interval", 4) or 4)
            recurrent = [i < n_layer and (i + 1) % interval != 0 for i in range(n_layer_all)]
        ssm = SsmShape(
            d_conv=int(get(f"{a}.ssm.conv_kernel", 0) or 0),
            d_inner=int(get(f"{a}.ssm.inner_size", 0) or 0),
            d_state=int(get(f"{a}.ssm.state_size", 0) or 0),
            n_group=int(get(f"{a}.ssm.group_count", 0) or 0),
            dt_rank=int(get(f"{a}.ssm.time_step_rank", 0) or 0),
        )

    if arch not in KNOWN_ARCHS:
        n_head_kv, head_dim_k, head_dim_v = _kv_from_tensors(by_name, n_layer_all, n_head_kv, head_dim_k, head_dim_v)
        warnings.append(
            f"unknown architecture '{arch}': planned from tensor sizes alone "
            "(KV cache from attn_k/attn_v shapes, compute buffers from a plain-transformer estimate)"
        )

    return ModelMeta(
        path=path,
        arch=arch,
        name=str(get("general.name", path.stem)),
        file_bytes=file_bytes,
        n_layer=n_layer,
        n_layer_nextn=n_nextn,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_ctx_train=int(get(f"{a}.context_length", 0) or 0),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        swa_window=swa_window,
        swa_layers=swa_layers,
        recurrent_layers=recurrent,
        ssm=ssm,
        n_expert=int(get(f"{a}.expert_count", 0) or 0),
        n_expert_used=int(get(f"{a}.expert_used_count", 0) or 0),
        n_ff_exp=int(get(f"{a}.expert_feed_forward_length", 0) or 0),
        target_layers=[int(x) for x in (get(f"{a}.target_layers", []) or [])],
        block_size=int(get(f"{a}.block_size", 0) or 0),
        tensors=tensors,
        warnings=warnings,
        selector_top_k=int(get(f"{a}.selector_top_k", 0) or 0),
        target_hidden_size=int(get(f"{a}.target_hidden_size", 0) or 0),
        is_dspark="markov_w1.weight" in by_name, dspark_confidence="conf_proj.weight" in by_name and bool(get(f"{a}.has_confidence_head", True)),
        sample_from_anchor=bool(get(f"{a}.sample_from_anchor", True)), dsv4_backbone=int(get(f"{a}.hyper_connection.count", 0) or 0) > 0,
    )


def _block_of(name: str) -> int | None:
    m = _BLOCK.match(name)
    return int(m[1]) if m else None


def _per_layer(value, n: int, fallback: list[int] | None = None) -> list[int]:
    if value is None:
        return list(fallback) if fallback is not None else [0] * n
    if isinstance(value, list):
        vals = [int(x) for x in value]
        return (vals + [vals[-1] if vals else 0] * n)[:n]
    return [int(value)] * n


def _swa_layers(arch: str, pattern, window: int, n_layer: int, n_layer_all: int) -> list[bool]:
    flags = [False] * n_layer_all
    if not window:
        return flags
    if isinstance(pattern, list):
        for i, x in enumerate(pattern[:n_layer]):
            flags[i] = bool(x)
        return flags
    n = int(pattern) if pattern else SWA_PATTERNS.get(arch, 0)
    for i in range(n_layer):
        flags[i] = n == 0 or (i % n < n - 1)
    return flags


def _width_from_tensors(by_name: dict[str, TensorInfo]) -> int:
    for name in ("token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight"):
        if name in by_name:
            return by_name[name].shape[0]
    return 0


def _kv_from_tensors(by_name, n_layer_all, n_head_kv, head_dim_k, head_dim_v):
    """For an unknown arch: per-block KV widths from ``attn_k``/``attn_v`` weight shapes."""
    widths_k, widths_v = [], []
    for il in range(n_layer_all):
        k = by_name.get(f"blk.{il}.attn_k.weight")
        v = by_name.get(f"blk.{il}.attn_v.weight")
        widths_k.append(k.shape[1] if k else 0)
        widths_v.append(v.shape[1] if v else (k.shape[1] if k else 0))
    if not any(widths_k):
        return n_head_kv, head_dim_k, head_dim_v
    hd_k = head_dim_k or 128
    hd_v = head_dim_v or hd_k
    heads = [max(wk // hd_k, 1) if wk else 0 for wk in widths_k]
    if any(wk and wk % hd_k for wk in widths_k) or any(wv and wv != h * hd_v for wv, h in zip(widths_v, heads)):
        heads = [1 if wk else 0 for wk in widths_k]
        hd_k = max(widths_k)
        hd_v = max(widths_v)
    return heads, hd_k, hd_v
