"""Requantize a GGUF file with llama.cpp's own quantizer (``llama_model_quantize``)."""

from __future__ import annotations

from pathlib import Path

from localflash.errors import LocalflashError
from localflash.llama.bindings import lib
from localflash.llama.runtime import check_gguf, default_threads

FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}


def quantize(src: str | Path, dst: str | Path, ftype: str = "Q4_K_M", allow_requantize: bool = True) -> Path:
    """Write ``dst`` as ``src`` quantized to ``ftype``; atomic (a temp file renamed on success)."""
    L = lib()
    if ftype.upper() not in FTYPES:
        raise LocalflashError(f"unknown quantization {ftype!r}", hint=f"use one of {', '.join(FTYPES)}")
    src = check_gguf(src)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".part")
    params = L.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype.upper()]
    params.nthread = default_threads()
    params.allow_requantize = allow_requantize
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise LocalflashError(f"quantizing {src.name} to {ftype} failed (code {rc})")
    tmp.replace(dst)
    return dst
