"""A heap report on demand from a `localflash serve` child: the soak's and leak probe's view of its memory.

:func:`probe_env` puts a ``sitecustomize`` on the child's path that (with ``LF_PROBE_DIR`` set) starts
tracemalloc (``frames`` > 0) and, on SIGUSR1, writes into that folder: a tracemalloc snapshot, the live
Python objects by type, glibc's ``malloc_stats`` over every arena (system and in-use bytes: llama.cpp's
C/C++ objects and Python's larger blocks) and VmRSS. :func:`heap_dump` signals and reads one back.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

SITECUSTOMIZE = r'''
import os
if os.environ.get("LF_PROBE_DIR"):
    import collections, ctypes, gc, json, signal, tempfile, tracemalloc
    if int(os.environ.get("LF_PROBE_FRAMES", "10")):
        tracemalloc.start(int(os.environ.get("LF_PROBE_FRAMES", "10")))

    def _arenas():
        libc = ctypes.CDLL("libc.so.6")
        with tempfile.TemporaryFile() as f:
            saved = os.dup(2)
            os.dup2(f.fileno(), 2)
            try:
                libc.malloc_stats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            f.seek(0)
            text = f.read().decode()
        total = text.split("Total (incl. mmap):")[-1]
        return {"system": int(total.split("system bytes     =")[1].split()[0]), "in_use": int(total.split("in use bytes     =")[1].split()[0]),
                "arenas": text.count("Arena ")}

    def _maps():
        """Rss (KiB) by mapping: [heap], [stack], each file, and anonymous maps by size class (thread stacks, arenas, mmaps)."""
        out, name = collections.Counter(), None
        for line in open("/proc/self/smaps"):
            first = line.split()
            if "-" in first[0] and len(first) >= 5 and ":" in first[3]:
                lo, hi = (int(x, 16) for x in first[0].split("-"))
                kib = (hi - lo) >> 10
                path = first[5] if len(first) > 5 else ""
                size = "1 MiB (obmalloc arenas)" if kib == 1024 else "8 MiB (thread stacks)" if kib == 8192 else \
                    "<1 MiB" if kib < 1024 else "1-63 MiB" if kib < 65536 else "64+ MiB"
                name = path.rsplit("/", 1)[-1] if path else f"anon {size}"
                out["#" + name] += 1
            elif first[0] == "Rss:":
                out[name] += int(first[1])
        return dict(out)

    def _dump(signum, frame):
        d = os.environ["LF_PROBE_DIR"]
        n = len([p for p in os.listdir(d) if p.endswith(".json")])
        gc.collect()
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(os.path.join(d, f"{n}.snap"))
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
        import io, sys
        saved, buf = os.dup(2), tempfile.TemporaryFile()
        os.dup2(buf.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        buf.seek(0)
        pym = {}
        for line in buf.read().decode().splitlines():
            for key in ("# arenas allocated current", "# bytes in allocated blocks", "# bytes in available blocks",
                        "# bytes in unused pools", "# arenas allocated total"):
                if line.startswith(key):
                    pym[key[2:]] = int(line.split("=")[-1].replace(",", "").strip())
        trimmed = None
        if os.environ.get("LF_PROBE_TRIM"):  # then give free heap pages back and read RSS again: what stays is held by live objects
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            trimmed = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
        out = {"rss_after_trim_kib": trimmed, "pymalloc": pym, "types": dict(types), "heap": _arenas(), "rss_kib": rss, "traced": tracemalloc.get_traced_memory()[0], "maps": _maps()}
        with open(os.path.join(d, f"{n}.tmp"), "w") as f:
            json.dump(out, f)
        os.rename(os.path.join(d, f"{n}.tmp"), os.path.join(d, f"{n}.json"))

    signal.signal(signal.SIGUSR1, _dump)
'''


def probe_env(work: Path, frames: int) -> dict:
    """The environment that makes a `localflash serve` child dump its heap into ``work/dumps`` on SIGUSR1 (``frames`` 0: no tracemalloc)."""
    (work / "site").mkdir(exist_ok=True)
    (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (work / "dumps").mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(work / "site"), os.environ.get("PYTHONPATH", "")]),
            "LF_PROBE_DIR": str(work / "dumps"), "LF_PROBE_FRAMES": str(frames)}


def heap_dump(proc, work: Path, i: int) -> dict:
    """Signal the server to dump (the i-th time); its dump once written."""
    proc.send_signal(signal.SIGUSR1)
    path = work / "dumps" / f"{i}.json"
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError("the server exited")
        time.sleep(0.1)
    return {**json.loads(path.read_text()), "snap": work / "dumps" / f"{i}.snap"}
