"""Safetensors files read and written with NumPy alone (bf16 included), so conversion needs neither torch nor transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from localflash.errors import LocalflashError

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


class SafetensorsFile:
    """One ``.safetensors`` file, memory-mapped; tensors come out as NumPy (bf16 -> float32)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            with path.open("rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 0 < n < 100_000_000:
                    raise ValueError("bad header length")
                header = json.loads(f.read(n))
        except (OSError, ValueError) as e:
            raise LocalflashError(f"{path.name} is not a readable safetensors file ({e})") from e
        header.pop("__metadata__", None)
        self.header = header
        self.base = 8 + n
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise LocalflashError(f"{self.path.name}: tensor {name} has unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        raw = self._map[self.base + b : self.base + e]
        arr = raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bias = 0x7FFF + ((u >> 16) & 1)
    return ((u + bias) >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], float_dtype: str = "bf16", metadata: dict | None = None) -> None:
    """Write ``tensors`` (floats converted to ``float_dtype``; ints and bools kept) as one safetensors file."""
    names = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
    header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype.kind == "f":
            if float_dtype == "bf16":
                data, dt = to_bf16_bits(arr), "BF16"
            else:
                data, dt = np.ascontiguousarray(arr, dtype=np.float16 if float_dtype == "f16" else np.float32), names[float_dtype]
        else:
            dt = {np.dtype(v): k for k, v in _ST_DTYPES.items() if k != "BF16"}[arr.dtype]
            data = np.ascontiguousarray(arr)
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + data.nbytes]}
        blobs.append(data)
        off += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for data in blobs:
            f.write(data.tobytes())
