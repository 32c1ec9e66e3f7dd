"""llama.cpp's own memory accounting for one model + context, read from its load log.

llama.cpp prints every buffer it allocates while loading a model and creating
a context ("CPU_Mapped model buffer size = 98.36 MiB", "CPU KV buffer size",
"CPU RS buffer size", "CPU compute buffer size", "CPU output buffer size").
``measure`` loads with the low-level API, captures those lines and returns the
bytes per buffer, so the planner (``localflash.plan``) can be checked against
the library that will actually hold the memory. With ``no_alloc=True`` nothing
is allocated: model and KV lines print 0 and only the compute sizes are real.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localflash.errors import LocalflashError
from localflash.llama import bindings
from localflash.llama.bindings import lib

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}

_LINE = re.compile(r"^\S+:\s+(?P<buf>\S+)\s+(?P<kind>model|KV|RS|compute|output) buffer size =\s*(?P<mib>[0-9.]+) MiB")
_MIB = 1024 * 1024


@dataclass
class Accounting:
    """Bytes per llama.cpp buffer name, by kind (as printed, rounded to 0.01 MiB)."""

    model: dict[str, int] = field(default_factory=dict)
    kv: dict[str, int] = field(default_factory=dict)
    recurrent: dict[str, int] = field(default_factory=dict)
    compute: dict[str, int] = field(default_factory=dict)
    output: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    probe: object = None  # what ``measure(on_loaded=...)`` returned while the model and context were alive

    def total(self, kind: str) -> int:
        return sum(getattr(self, kind).values())

    def add(self, kind: str, buffer: str, nbytes: int) -> None:
        table = {"model": self.model, "KV": self.kv, "RS": self.recurrent, "compute": self.compute, "output": self.output}[kind]
        table[buffer] = table.get(buffer, 0) + nbytes


def parse_log(lines: list[str]) -> Accounting:
    """Collect the buffer-size lines of a llama.cpp load log."""
    acc = Accounting(log=list(lines))
    for line in lines:
        m = _LINE.match(line.strip())
        if m:
            acc.add(m["kind"], m["buf"], round(float(m["mib"]) * _MIB))
    return acc


def measure(
    path: str | Path,
    *,
    n_ctx: int,
    n_batch: int = 512,
    n_ubatch: int = 512,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: bool = True,
    n_outputs_max: int = 0,
    n_seq_max: int = 1,
    n_rs_seq: int = 0,
    n_gpu_layers: int = 0,
    split_mode: str = "layer",
    main_gpu: int = 0,
    tensor_split: list[float] | None = None,
    no_alloc: bool = False,
    on_loaded: Callable[[], object] | None = None,
    load_mtp: bool = False,
    mtp_context: bool = False,
    use_mmap: bool = True,
) -> Accounting:
    """Load ``path``, create one context, free both, and return what llama.cpp reported.

    ``on_loaded`` runs while both are alive (e.g. to read the device memory NVML sees).
    ``load_mtp`` loads the MTP/nextn blocks too; ``mtp_context`` makes the context an MTP one.
    ``use_mmap=False`` reads the weights into buffers of their own: a mapped file's buffer spans the
    whole file whatever is loaded, so only then do the model buffers grow by exactly what is loaded."""
    L = lib()
    lines: list[str] = []

    @L.llama_log_callback
    def on_log(level, text, user_data):
        lines.append(text.decode("utf-8", errors="replace"))

    L.llama_log_set(on_log, ctypes.c_void_p(0))
    model = ctx = probe = None
    split = None
    if tensor_split:
        split = (ctypes.c_float * L.llama_max_devices())(*tensor_split)
    try:
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        mp.split_mode = SPLIT_MODES[split_mode]
        mp.main_gpu = main_gpu
        mp.no_alloc = no_alloc
        mp.load_mtp = load_mtp or mtp_context
        if split is not None:
            mp.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        if no_alloc or not use_mmap:
            mp.load_mode = L.LLAMA_LOAD_MODE_NONE  # the dry run cannot map the file
        model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise LocalflashError(f"llama.cpp could not load {path}", hint="".join(lines[-5:]).strip() or None)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_seq_max = n_seq_max
        cp.n_rs_seq = n_rs_seq
        cp.n_outputs_max = n_outputs_max
        cp.type_k = GGML_TYPES[type_k]
        cp.type_v = GGML_TYPES[type_v]
        cp.flash_attn_type = 1 if flash_attn else 0
        if mtp_context:
            cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise LocalflashError(f"llama.cpp could not create a context for {path}", hint="".join(lines[-5:]).strip() or None)
        if on_loaded is not None:
            probe = on_loaded()
    finally:
        if ctx:
            L.llama_free(ctx)
        if model:
            L.llama_model_free(model)
        _restore_log(L)
    acc = parse_log("".join(lines).splitlines())
    acc.probe = probe
    return acc


def _restore_log(L) -> None:
    previous = bindings._state.log_cb
    if previous is not None:
        L.llama_log_set(previous, ctypes.c_void_p(0))
