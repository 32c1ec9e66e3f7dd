"""The memory a plan may use: GPUs from NVML (``nvidia-ml-py``, optional) and host RAM from /proc/meminfo.

Nothing here touches llama.cpp. ``detect()`` lists the NVIDIA GPUs with their
names, total and free memory (an empty list on a machine without NVML or
without GPUs), and ``host_memory()`` reads total and available RAM. Budgets
given on the command line (``--vram 24GiB``, ``--gpus 24GiB,24GiB`` or
``--gpus 0,1``) are resolved against what was detected by ``select_gpus``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from localflash.errors import LocalflashError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the planner sees it: ``free`` is what a plan may fill (before the safety margin)."""

    index: int
    name: str
    total: int
    free: int
    endpoint: str | None = None  # a remote device: an rpc-server's HOST:PORT (its device ``index`` there)

    @property
    def label(self) -> str:
        """``GPU0``, or ``RPC host:port`` (``#i`` past a server's first device)."""
        if self.endpoint is None:
            return f"GPU{self.index}"
        return f"RPC {self.endpoint}" + (f"#{self.index}" if self.index else "")

    @property
    def key(self) -> str:
        """How the runtime names this device: ``gpu:0``, ``rpc:HOST:PORT#0``."""
        return f"gpu:{self.index}" if self.endpoint is None else f"rpc:{self.endpoint}#{self.index}"


@dataclass(frozen=True)
class HostMemory:
    total: int
    available: int


def parse_size(text: str) -> int:
    """``"24GiB"`` -> 25769803776, ``"22.3GB"`` -> 22300000000, ``"512MiB"``; a bare number is GiB."""
    m = _SIZE.match(text)
    unit = m[2].lower() if m else ""
    if not m or unit not in _UNITS:
        raise LocalflashError(f"not a memory size: {text!r}", hint="write sizes like 24GiB, 23.5GB or 512MiB")
    return int(float(m[1]) * (_UNITS[unit] if unit else 1024**3))


def fmt_bytes(n: int | float | None) -> str:
    """A size for tables and reports: B, KiB, MiB, GiB or TiB with one decimal (None: "-")."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_size(n: int) -> str:
    """A size in the planner's messages: GiB with two decimals from 1 GiB, else whole MiB."""
    return f"{n / 1024**3:.2f} GiB" if abs(n) >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def detect() -> list[Gpu]:
    """NVIDIA GPUs via NVML; ``[]`` when ``nvidia-ml-py`` is missing or no driver answers."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else str(name), int(mem.total), int(mem.free)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def used_by_process(pid: int) -> dict[int, int]:
    """Device memory NVML attributes to ``pid``, per GPU index (for planned-vs-measured checks)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    out[i] = out.get(i, 0) + int(proc.usedGpuMemory)
        return out
    finally:
        pynvml.nvmlShutdown()


def host_memory(meminfo: str | Path = "/proc/meminfo") -> HostMemory:
    """Total and available host RAM from ``/proc/meminfo`` (MemAvailable, else MemFree + Cached)."""
    values = {}
    for line in Path(meminfo).read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * 1024
    available = values.get("MemAvailable", values.get("MemFree", 0) + values.get("Cached", 0))
    return HostMemory(values.get("MemTotal", 0), available)


def remote_gpus(endpoints: list[str], timeout: float = 3.0) -> list[Gpu]:
    """The devices of rpc-servers as the planner's cards (asked over the wire: ``llama/rpc_wire.py``)."""
    from localflash.llama.rpc_wire import probe_all

    return [Gpu(d.device, f"rpc-server {d.endpoint}", d.total, d.free, d.endpoint) for d in probe_all(endpoints, timeout)]


def select_gpus(detected: list[Gpu], vram: str | None = None, gpus: str | None = None) -> list[Gpu]:
    """The GPUs a plan targets.

    - nothing given: every detected GPU with its free memory;
    - ``vram="24GiB"``: one card of that size (the first detected card's name, if any);
    - ``gpus="0,1"``: detected cards by index; an index that does not exist is an error;
    - ``gpus="24GiB,24GiB"``: cards of those sizes. On a machine with GPUs, asking for more
      cards than it has is an error; on a machine without any, the cards are hypothetical
      (planning for another rig).
    """
    if vram and gpus:
        raise LocalflashError("--vram and --gpus both given", hint="use --vram for one card, --gpus for several")
    if vram:
        size = parse_size(vram)
        name = detected[0].name if detected else "GPU"
        return [Gpu(0, name, size, min(size, detected[0].free) if detected else size)]
    if not gpus:
        return list(detected)
    items = [x.strip() for x in gpus.split(",") if x.strip()]
    if all(x.isdigit() for x in items):
        chosen = []
        for x in items:
            i = int(x)
            if i >= len(detected):
                have = ", ".join(f"{g.index}: {g.name}" for g in detected) or "none"
                raise LocalflashError(
                    f"--gpus asks for GPU {i}, but this machine has {len(detected)} GPU(s) ({have})",
                    hint="list existing indices, or give sizes (--gpus 24GiB,24GiB) to plan for another machine",
                )
            chosen.append(detected[i])
        return chosen
    sizes = [parse_size(x) for x in items]
    if detected and len(sizes) > len(detected):
        raise LocalflashError(
            f"--gpus lists {len(sizes)} cards, but this machine has {len(detected)} GPU(s)",
            hint="give at most one size per installed card",
        )
    out = []
    for i, size in enumerate(sizes):
        name = detected[i].name if i < len(detected) else "GPU"
        free = min(size, detected[i].free) if i < len(detected) else size
        out.append(Gpu(i, name, size, free))
    return out
