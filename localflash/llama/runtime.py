"""Models, contexts and batches over llama.cpp's low-level C API.

Token ids go in as Python ints or NumPy arrays; logits and layer inputs come
out as NumPy views onto llama.cpp's own buffers (valid until the next decode
on that context), so no full-vocabulary copy is made unless the caller asks.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama.batch import Batch  # noqa: F401  (re-exported)
from localflash.llama.bindings import ext, ext_address, lib, recent_log
from localflash.llama.views import address_view, float_view
from localflash.llama.rpc import device_array, local_gpus
from localflash.llama.embd_rows import EmbdRows
from localflash.llama.graph_sampling import InGraphSampling
from localflash.llama.outputs import OutputBuffer
from localflash.llama.rollback import RecurrentCache, StateCheckpoint  # noqa: F401  (StateCheckpoint: re-exported)

GGUF_MAGIC = b"GGUF"

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}


def check_gguf(path: str | Path) -> Path:
    """Fail with one line unless ``path`` is an existing GGUF file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LocalflashError(f"model file not found: {p}", hint="check the path, or list pairs with `localflash models`")
    if not p.is_file():
        raise LocalflashError(f"not a file: {p}")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise LocalflashError(f"not a GGUF file: {p}", hint="localflash loads llama.cpp GGUF models (*.gguf)")
    return p


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp has a local GPU to offload to (llama_supports_gpu_offload also counts an RPC backend)."""
    return bool(local_gpus())


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


# GGML_CPU_TILED_MM as ggml read it: ggml-cpu reads the switch once per process, at the first
# matmul; None until this process makes its first Context.
_tiled_mm_at_first_context: str | None = None


def use_exact_numerics() -> None:
    """Make a row's logits independent of its batch's size, for this whole process.

    ggml's CPU backend multiplies K-quant weights by 8+ rows with a tiled kernel and by fewer
    rows with vec_dot; the two round differently, so a verify batch and a one-token decode of
    the same position disagree in the last bits. This turns the tiled kernel off
    (``GGML_CPU_TILED_MM=0``), which ggml reads once per process: it must run before the
    process creates its first context. The other exact-mode settings are per model/context
    (``ModelOptions.use_extra_bufts``, ``ContextOptions.flash_attn`` / ``n_threads_single``).
    """
    if _tiled_mm_at_first_context not in (None, "0"):
        raise LocalflashError(
            "exact mode must be chosen before this process creates its first model context",
            hint="use a new process, or start it with GGML_CPU_TILED_MM=0 in the environment",
        )
    os.environ["GGML_CPU_TILED_MM"] = "0"


@dataclass
class ModelOptions:
    n_gpu_layers: int = -1
    split_mode: int = 1  # LAYER
    main_gpu: int = 0
    tensor_split: list[float] | None = None
    use_mmap: bool = True
    vocab_only: bool = False
    tensor_overrides: list[tuple[str, str]] | None = None  # (regex, "CPU"): keep matching tensors in host RAM
    load_mtp: bool = False  # also load the MTP ("nextn") blocks, for an MTP drafting context on the same model
    # CPU weight repacking (llama.cpp's "extra buffer types", e.g. Q4_K -> Q4_K_8x8): faster, but a
    # row's logits then depend on how many rows the batch has; exact mode turns it off
    use_extra_bufts: bool = True
    devices: list[str] | None = None  # ggml device names to place layers on, in order (RPC0, CUDA0; []: CPU only); None: all


class Model:
    """A loaded GGUF model: weights, vocabulary and metadata."""

    def __init__(self, path: str | Path, options: ModelOptions | None = None):
        L = lib()
        self.path = check_gguf(path)
        o = options or ModelOptions()
        self.options = o
        params = L.llama_model_default_params()
        params.n_gpu_layers = o.n_gpu_layers
        params.split_mode = o.split_mode
        params.main_gpu = o.main_gpu
        params.vocab_only = o.vocab_only
        params.load_mtp = o.load_mtp
        params.use_extra_bufts = o.use_extra_bufts
        params.load_mode = L.LLAMA_LOAD_MODE_MMAP if o.use_mmap else L.LLAMA_LOAD_MODE_NONE
        self._tensor_split = None
        if o.tensor_split:
            n = L.llama_max_devices()
            self._tensor_split = (ctypes.c_float * n)(*(o.tensor_split + [0.0] * (n - len(o.tensor_split)))[:n])
            params.tensor_split = self._tensor_split
        self._devices = device_array(o.devices) if o.devices is not None else None  # kept alive with the model
        if self._devices is not None:
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        self._overrides = _buft_overrides(o.tensor_overrides) if o.tensor_overrides else None
        if self._overrides is not None:
            params.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)
        self.ptr = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            raise LocalflashError(f"llama.cpp could not load {self.path.name}: {_last_error()}")
        self._free = weakref.finalize(self, L.llama_model_free, self.ptr)
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self._eog: dict[int, bool] = {}  # token -> end of generation, filled as tokens are asked about
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_embd = L.llama_model_n_embd(self.ptr)
        self.n_layer = L.llama_model_n_layer(self.ptr)
        self.n_layer_nextn = L.llama_model_n_layer_nextn(self.ptr)  # MTP blocks in the file (loaded only with load_mtp)
        self.mtp_loaded = o.load_mtp and self.n_layer_nextn > 0
        self.arch = self.meta("general.architecture") or "?"
        self.bos = L.llama_vocab_bos(self.vocab)
        self.eos = L.llama_vocab_eos(self.vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self._piece_cache: dict[int, bytes] = {}

    # -- metadata -----------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lib().llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def size_bytes(self) -> int:
        return lib().llama_model_size(self.ptr)

    @property
    def n_params(self) -> int:
        return lib().llama_model_n_params(self.ptr)

    def chat_template(self) -> str | None:
        ptr = lib().llama_model_chat_template(self.ptr, None)
        return ptr.decode("utf-8", errors="replace") if ptr else None

    def target_layer_ids(self) -> list[int]:
        """The ``<arch>.target_layers`` of a DFlash/EAGLE-3 drafter (layer-input ids)."""
        x = ext()
        n = x.llama_model_target_layer_ids_n(self.ptr)
        ids = x.llama_model_target_layer_ids(self.ptr)
        return [ids[i] for i in range(n)]

    def dflash_selector_top_k(self) -> int:
        """Candidates per block position of a DFlash2 selector; 0 for DFlash1 and other models."""
        return int(ext().llama_model_dflash_selector_top_k(self.ptr))

    def mask_token(self) -> int:
        return lib().llama_vocab_mask(self.vocab)

    # -- vocabulary ---------------------------------------------------------
    def is_eog(self, token: int) -> bool:
        if token not in self._eog:  # asked for every sampled row: a dict beats a ctypes call
            self._eog[token] = bool(lib().llama_vocab_is_eog(self.vocab, token))
        return self._eog[token]

    @property
    def eog_ids(self) -> frozenset:
        """Every end-of-generation token id, found once by asking llama.cpp about each token (a set test per
        sampled row is then no call at all: the in-graph verify step reads a cycle's rows with none)."""
        ids = self.__dict__.get("_eog_ids")
        if ids is None:
            is_eog, vocab = lib().llama_vocab_is_eog, self.vocab
            ids = self._eog_ids = frozenset(t for t in range(self.n_vocab) if is_eog(vocab, t))
        return ids

    def token_text(self, token: int) -> str:
        t = lib().llama_vocab_get_text(self.vocab, token)
        return t.decode("utf-8", errors="replace") if t else ""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        L = lib()
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Raw bytes of one token (may be part of a UTF-8 character)."""
        b = self._piece_cache.get(token)
        if b is None:
            buf = ctypes.create_string_buffer(64)
            n = lib().llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lib().llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            b = buf.raw[:n]
            self._piece_cache[token] = b
        return b

    def detokenize(self, tokens) -> str:
        return b"".join(self.piece(int(t)) for t in tokens).decode("utf-8", errors="replace")

    def close(self) -> None:
        self._free()
        self.ptr = None


@dataclass
class ContextOptions:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_outputs_max: int = 0  # 0 = n_batch
    n_threads: int = 0  # 0 = default_threads()
    # threads for one-token decodes (llama.cpp's n_threads; batches use n_threads_batch = n_threads).
    # 0 = n_threads. Exact mode uses 1: ggml splits one row's attention over the KV cache across
    # threads (512+ cells), which rounds differently from the same row inside a batch.
    n_threads_single: int = 0
    # decode batches of fewer rows padded to this many (exact mode: 2). A one-row decode takes other
    # kernels than a batch (vec_dot instead of llamafile's sgemm for F32/F16/Q8_0/Q4_0 weights, a
    # KV-split attention with 512+ cells): decoding [t, t] at (p, p+1) and dropping p+1 again gives
    # row p exactly the numerics it has inside a verify batch. Not for recurrent/hybrid memory.
    min_rows: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: int = -1  # AUTO
    n_rs_seq: int = 0  # recurrent-state snapshots, for hybrid targets' rollback
    # sequences the context holds (parallel slots, tree branches); n_ctx is shared by all of them.
    # kv_unified False gives each sequence its own KV stream of n_ctx / n_seq_max cells, laid out as a
    # one-sequence context would lay it out (a row's attention sums the same cells in the same order)
    n_seq_max: int = 1
    kv_unified: bool = True
    mtp: bool = False  # an MTP context: runs the model's nextn block (LLAMA_CONTEXT_TYPE_MTP)


class Context(EmbdRows, RecurrentCache, InGraphSampling, OutputBuffer):
    """An inference context (KV cache, compute buffers) on one model, sequence 0 (its rows may be sampled in the graph)."""

    def __init__(self, model: Model, options: ContextOptions | None = None, other: "Context | None" = None):
        global _tiled_mm_at_first_context
        L = lib()
        self.model = model
        o = options or ContextOptions()
        if _tiled_mm_at_first_context is None:
            _tiled_mm_at_first_context = os.environ.get("GGML_CPU_TILED_MM", "1")
        p = L.llama_context_default_params()
        p.n_ctx = o.n_ctx
        p.n_batch = min(o.n_batch, o.n_ctx)
        p.n_ubatch = min(o.n_ubatch, p.n_batch)
        p.n_seq_max = max(1, o.n_seq_max)
        p.kv_unified = o.kv_unified
        p.n_outputs_max = max(o.n_outputs_max, o.min_rows) if o.n_outputs_max else 0
        p.n_outputs_max_per_seq = 0  # = n_outputs_max: in-graph samplers may then take every output row
        p.n_rs_seq = o.n_rs_seq
        if o.mtp:
            p.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        threads = o.n_threads or default_threads()
        p.n_threads = min(o.n_threads_single, threads) if o.n_threads_single else threads
        p.n_threads_batch = threads
        p.flash_attn_type = o.flash_attn
        for name, attr in (("type_k", o.type_k), ("type_v", o.type_v)):
            if attr not in KV_TYPES:
                raise LocalflashError(f"unknown KV cache type {attr!r}", hint=f"use one of {', '.join(KV_TYPES)}")
            setattr(p, name, KV_TYPES[attr])
        if other is not None:
            p.ctx_other = other.ptr
        self.ptr = L.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            raise LocalflashError(f"llama.cpp could not create a context for {model.path.name}: {_last_error()}")
        self._init_graph_sampling()
        self._init_outputs()
        self._free = self._finalizer()  # the context, then any sampler chain it holds
        self.min_rows = max(1, o.min_rows)
        self.n_ctx = L.llama_n_ctx(self.ptr) - (self.min_rows - 1)  # room for the padding row(s)
        self.n_batch = p.n_batch
        self.n_outputs_max = o.n_outputs_max or p.n_batch
        self.mem = L.llama_get_memory(self.ptr)
        self.n_seq_max, self.kv_unified = p.n_seq_max, bool(p.kv_unified)  # kv_unified: all sequences' cells in one pool
        self.n_ctx_seq = L.llama_n_ctx_seq(self.ptr) - (self.min_rows - 1)  # one sequence's share (all of it when unified)
        self.seq = 0  # the sequence this object's own decodes and cuts address
        self._batch = Batch(self.n_batch, n_seq_max=p.n_seq_max)
        self._embd_batch: Batch | None = None
        self._n_out = 0
        self._last_row = -1
        self.n_last = 0  # tokens in the last token decode (rows of layer inputs)
        self.n_decodes = 0  # llama_decode calls so far (what batching across sequences saves is counted by it)
        self._tap_views: dict = {}  # (layer-input addresses, rows) -> their views (layer_inputs, read every cycle)
        self._llama_decode = lib().llama_decode
        self._init_rollback(getattr(o, "mtp", False), p.n_ubatch)

    # -- decoding -----------------------------------------------------------
    def decode(self, tokens, start_pos: int, outputs: str = "last") -> int:
        """Decode ``tokens`` at ``start_pos..``; ``outputs`` is ``last``, ``all`` or ``none``.

        Returns the number of output rows; read them with :meth:`logits`.
        The batch must fit ``n_batch``; longer input goes through :meth:`prefill`.
        """
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        b = self._batch
        if self.n_seq_max > 1:
            b.reset_seqs(max(n, self.min_rows))  # the rows this decode uses, padding included
        if outputs == "all" and n > self.n_outputs_max:
            raise LocalflashError(f"{n} output rows requested but the context was made for {self.n_outputs_max}")
        n_out = b.fill(tokens, start_pos, outputs)
        pad = self.min_rows - n if n < self.min_rows else 0
        if pad:  # copies of the last token, cut off again below; with outputs if the real rows have any,
            # so that the output projection, too, multiplies a batch (not one row)
            b.token[n : n + pad] = b.token[n - 1]
            b.pos[n : n + pad] = np.arange(start_pos + n, start_pos + n + pad, dtype=np.int32)
            b.logits[n : n + pad] = int(outputs != "none")
            b.flags_set = None
        b.raw.n_tokens = n + pad
        self._outs_next = (n_out + pad, outputs == "all") if outputs != "none" else (0, False)
        self._run(b.raw, n + pad)
        self._last_start, self.end, self._rolled = start_pos, start_pos + n + pad, False  # (RecurrentCache._decoded)
        if pad:
            self.seq_rm(start_pos + n)
        self._last_row = n - 1 if pad else -1  # logits(-1): the last real row, not a padding row
        self._n_out = n_out
        self.n_last = n
        return n_out

    def decode_rows(self, tokens, pos, seqs, outputs) -> None:
        """One decode of rows from several sequences: ``tokens[i]`` at ``pos[i]`` in ``seqs[i]``.

        ``outputs[i]`` marks the rows whose logits are wanted; :meth:`logits` takes a row's
        batch index. No padding and no rollback bookkeeping: the caller (one view per
        sequence, ``localflash.llama.sequences``) keeps each sequence's.
        """
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        n_out = int(np.count_nonzero(outputs))
        if n_out > self.n_outputs_max:
            raise LocalflashError(f"{n_out} output rows requested but the context was made for {self.n_outputs_max}")
        b = self._batch
        b.token[:n] = tokens
        b.pos[:n] = pos
        b.logits[:n] = outputs
        b.flags_set = None
        if type(seqs) is tuple:  # (first, count): row i in sequences first[i] .. first[i] + count[i] - 1 (a tree's)
            b.set_seq_spans(*seqs)
        else:
            b.set_seqs(seqs)
        b.raw.n_tokens = n
        self._outs_next = (n_out, n_out == n)
        self._run(b.raw, n)
        self._last_row = -1
        self._n_out = n_out
        self.n_last = n

    def last_tokens(self) -> np.ndarray:
        """The token ids of the last token decode (a view, valid until the next one)."""
        return self._batch.token[: self.n_last]

    def _run(self, raw, n: int) -> None:
        self.n_decodes += 1
        self._out_start = 0  # (outputs.py) the output buffer is found again after each decode
        self._outs, self._outs_next = self._outs_next, None  # a decode that does not say its outputs: read by the getters
        self._out_graph = bool(self._chains)  # its layout holds sampled ids only if a chain was attached
        rc = self._llama_decode(self.ptr, raw)
        if rc != 0:
            if rc == 1:
                raise LocalflashError(
                    f"the context is full ({self.n_ctx} tokens)", hint="raise -c/--ctx or shorten the prompt"
                )
            raise LocalflashError(f"llama_decode failed with code {rc} on a batch of {n}: {_last_error()}")

    def logits(self, row: int = -1) -> np.ndarray:
        """Logits of output row ``row`` of the last decode, a view of ``n_vocab`` floats."""
        ptr = lib().llama_get_logits_ith(self.ptr, self._last_row if row == -1 else row)
        if not ptr:
            raise LocalflashError("no logits for that row")
        return float_view(ptr, (self.model.n_vocab,))

    def all_logits(self) -> np.ndarray:
        """All output rows of the last decode, a ``[n_outputs, n_vocab]`` view."""
        ptr = lib().llama_get_logits(self.ptr)
        return float_view(ptr, (self._n_out, self.model.n_vocab))

    # -- memory -------------------------------------------------------------
    def pos_max(self, seq: int = 0) -> int:
        return lib().llama_memory_seq_pos_max(self.mem, seq)

    def clear(self) -> None:
        lib().llama_memory_clear(self.mem, True)
        self._cleared()

    def set_causal(self, causal: bool) -> None:
        lib().llama_set_causal_attn(self.ptr, causal)

    # -- layer inputs (DFlash / EAGLE-3 features) --------------------------
    def capture_layer_inputs(self, layer_ids: list[int]) -> None:
        for lid in layer_ids:
            if not 0 <= lid < self.model.n_layer:
                raise LocalflashError(
                    f"layer input {lid} is outside {self.model.path.name}'s layers 0..{self.model.n_layer - 1}",
                    hint="the drafter was made for a deeper target",
                )
            ext().llama_set_embeddings_layer_inp(self.ptr, lid, True)
            if lid not in self._taps:
                self._taps = sorted(self._taps + [lid])
                self._out_kind = (len(self._taps), self._nextn)

    def layer_input(self, lid: int, n_rows: int) -> np.ndarray:
        """The input of layer ``lid`` for every token of the last decode: ``[n_rows, n_embd]`` view."""
        return self.layer_inputs((lid,), n_rows)[0]

    def layer_inputs(self, layer_ids, n_rows: int) -> list[np.ndarray]:
        """:meth:`layer_input` of each of ``layer_ids`` (cached views: read every cycle; from the output buffer's start, outputs.py)."""
        addresses = self._layer_addresses(layer_ids)  # no call into llama.cpp once the layout is known
        if addresses is None:
            get, ptr = ext_address("llama_get_embeddings_layer_inp"), self.ptr
            addresses = tuple([get(ptr, lid) for lid in layer_ids])
        key = (addresses, n_rows)
        out = self._tap_views.get(key)
        if out is None:  # new buffers (llama.cpp grew them) or another row count: views made once
            shape = (n_rows, self.model.n_embd)
            for lid, address in zip(layer_ids, addresses):
                if not address:
                    raise LocalflashError(f"layer {lid} inputs were not captured", hint="call capture_layer_inputs first")
            if len(self._tap_views) >= 64:
                self._tap_views.clear()
            out = self._tap_views[key] = [address_view(a, shape) for a in addresses]
        return out

    # -- nextn outputs (DFlash2 selector lattice, EAGLE-3 hidden states) ---
    def output_nextn(self, masked: bool) -> None:
        """Make decodes output the graph's ``h_nextn`` rows: only output rows (``masked``) or every row."""
        ext().llama_set_embeddings_nextn(self.ptr, True, masked)
        self._nextn = 1 if masked else 2
        self._out_kind = (len(self._taps), self._nextn)

    def nextn_rows(self, n_rows: int) -> np.ndarray:
        """The ``h_nextn`` rows of the last decode/encode: a ``[n_rows, n_embd]`` view."""
        ptr = ext().llama_get_embeddings_nextn(self.ptr)
        if not ptr:
            raise LocalflashError("no nextn rows", hint="call output_nextn before decoding")
        return float_view(ptr, (n_rows, self.model.n_embd))

    def close(self) -> None:
        self._free()
        self.ptr = None


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _buft_overrides(rules: list[tuple[str, str]]):
    """A NULL-terminated ``llama_model_tensor_buft_override`` array (only host RAM, "CPU", is offered)."""
    cpu = _ggml_base().ggml_backend_cpu_buffer_type()
    arr = (_BuftOverride * (len(rules) + 1))()
    for i, (pattern, where) in enumerate(rules):
        if where.upper() != "CPU":
            raise LocalflashError(f"tensor override to {where!r}: only CPU (host RAM) is supported")
        arr[i].pattern = pattern.encode()
        arr[i].buft = cpu
    return arr


def _ggml_base():
    import glob

    lib_dir = Path(lib().__file__).parent / "lib"
    so = ctypes.CDLL(sorted(glob.glob(str(lib_dir / "libggml-base.so*")))[0])
    so.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    so.ggml_backend_cpu_buffer_type.argtypes = []
    return so


def _last_error() -> str:
    """The most specific failure llama.cpp logged ("error loading model: <why>" beats "failed to load model")."""
    lines = [ln.strip() for ln in recent_log() if "error" in ln.lower() or "failed" in ln.lower()]
    specific = [ln for ln in lines if "error loading model:" in ln or "error:" in ln.lower()]
    chosen = (specific or lines or ["see --verbose for llama.cpp's log"])[-1]
    return chosen.split("error loading model:", 1)[-1].strip()
