"""Where a batched server's CPU goes: thread CPU per generated token, and the slot pool's step split into llama_decode and the rest.

Load-robust figures (CPU seconds counted by the kernel per thread, and counts), so they can be taken on a
busy machine; wall-clock ones are printed with the 1-minute load beside them.

``localflash serve ARGS`` runs in a child process with a sampler thread that, on request, writes
``{native thread id: (Python name or "native", utime+stime ticks)}`` for every thread of the process, and
with ``Context._run`` (the one ``llama_decode`` call) and ``SlotPool._step`` wrapped to add up their wall and
thread-CPU time. ``--peer`` runs llama-server instead (per-thread CPU only: its threads have no names).
C streamed greedy chat clients (the real openai client, as bench_vs_llama_server.py) run against it, and the
difference of two snapshots is printed per thread kind, per generated token.

    .venv/bin/python benchmarks/serve/profile_serve_threads.py -m target.gguf -t 2 -c 8192 --slots 4 --clients 4 --spec none
    .venv/bin/python benchmarks/serve/profile_serve_threads.py -m target.gguf -t 2 -c 8192 --slots 4 --clients 4 --peer peer/bin/llama-server
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_vs_llama_server import LlamaServer, run_clients, thread_cpu  # this script's folder is sys.path[0]

TICK = os.sysconf("SC_CLK_TCK")

# runs inside the server process: the sampler and the wrappers; a snapshot is written to SNAP when TRIGGER appears
BOOT = r"""
import json, os, sys, threading, time
from pathlib import Path
snap, trigger = Path(os.environ["LF_PROF_SNAP"]), Path(os.environ["LF_PROF_TRIGGER"])
acc = {"decode_wall": 0.0, "decode_cpu": 0.0, "decodes": 0, "step_wall": 0.0, "step_cpu": 0.0, "steps": 0, "rows": 0}
import localflash.llama.runtime as rt
_run = rt.Context._run
def run(self, raw, n):
    w, c = time.perf_counter(), time.thread_time()
    try:
        return _run(self, raw, n)
    finally:
        acc["decode_wall"] += time.perf_counter() - w; acc["decode_cpu"] += time.thread_time() - c
        acc["decodes"] += 1; acc["rows"] += n
        name = "rows:" + self.model.path.name  # rows each model decoded (a drafter's intake shows here)
        acc[name] = acc.get(name, 0) + n
rt.Context._run = run
import localflash.speculative.slots as sl
_step = sl.SlotPool._step
def step(self, *a, **k):
    w, c = time.perf_counter(), time.thread_time()
    try:
        return _step(self, *a, **k)
    finally:
        acc["step_wall"] += time.perf_counter() - w; acc["step_cpu"] += time.thread_time() - c; acc["steps"] += 1
sl.SlotPool._step = step
def threads():
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (names.get(int(tid), "native"), int(f[11]) + int(f[12]))
    return out
def sampler():
    n = 0
    while True:
        if trigger.exists():
            trigger.unlink()
            tmp = snap.with_suffix(f".{n}")
            tmp.write_text(json.dumps({"threads": threads(), "acc": dict(acc), "spin": os.environ.get("GOMP_SPINCOUNT", "libgomp default")}))
            tmp.rename(snap)
            n += 1
        time.sleep(0.02)
threading.Thread(target=sampler, name="prof-sampler", daemon=True).start()
from localflash.cli import main
sys.argv = ["localflash"] + sys.argv[1:]
main()
"""


def kind_of(name: str) -> str:
    if name.startswith("localflash-worker"):
        return "worker threads"
    return {"localflash-slots": "slot pool (+ OMP master)", "MainThread": "event loop (uvicorn)", "native": "native (OMP workers, ...)",
            "prof-sampler": "profiler"}.get(name, "other python")


class ProfiledServer:
    def __init__(self, args: list[str], work: Path):
        self.snap, self.trigger = work / "snap.json", work / "trigger"
        env = dict(os.environ, LF_PROF_SNAP=str(self.snap), LF_PROF_TRIGGER=str(self.trigger))
        self.log = work / "server.log"
        self.out = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", BOOT, "serve", "--host", "127.0.0.1", "--port", "0", *args],
                                     stdout=self.out, stderr=subprocess.STDOUT, env=env)
        import re

        deadline = time.monotonic() + 600
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)", self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        self.url = f"http://127.0.0.1:{m.group(1)}"
        while httpx.get(self.url + "/health").status_code != 200:
            time.sleep(0.1)
        self.model = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]

    def snapshot(self) -> dict:
        mtime = self.snap.stat().st_mtime_ns if self.snap.exists() else 0
        self.trigger.touch()
        while not self.snap.exists() or self.snap.stat().st_mtime_ns == mtime:
            time.sleep(0.01)
        return json.loads(self.snap.read_text())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.out.close()


def peer_snapshot(pid: int) -> dict:
    return {"threads": {tid: ("native", seconds * TICK) for tid, seconds in thread_cpu(pid).items()}, "acc": {}}


def diff(a: dict, b: dict, tokens: int, wall: float) -> dict:
    per_kind: dict[str, float] = {}
    busy = []
    for tid, (name, ticks) in b["threads"].items():
        d = (ticks - a["threads"].get(tid, (name, 0))[1]) / TICK
        k = kind_of(name)
        per_kind[k] = per_kind.get(k, 0.0) + d
        if d > 0.05:
            busy.append((name, tid, round(d, 2)))
    acc = {k: b["acc"][k] - a["acc"].get(k, 0) for k in b["acc"]}
    rows_by_model = {k[5:]: v for k, v in acc.items() if k.startswith("rows:")}
    total = sum(per_kind.values())
    out = {"gomp_spincount": b.get("spin", "?"), "tokens": tokens, "wall_s": round(wall, 2), "agg_tok_s": round(tokens / wall, 2), "cpu_s": round(total, 2),
           "cpu_ms_per_token": round(1000 * total / tokens, 1),
           "cpu_ms_per_token_by_kind": {k: round(1000 * v / tokens, 1) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
           "busy_threads": sorted(busy, key=lambda x: -x[2])}
    if rows_by_model:
        out["rows_by_model"] = rows_by_model
    if acc.get("steps"):
        s = acc["steps"]
        out["pool"] = {"steps": s, "decodes": acc["decodes"], "rows_per_decode": round(acc["rows"] / max(1, acc["decodes"]), 2),
                       "step_wall_ms": round(1000 * acc["step_wall"] / s, 1), "decode_wall_ms_per_step": round(1000 * acc["decode_wall"] / s, 1),
                       "outside_decode_in_step_ms": round(1000 * (acc["step_wall"] - acc["decode_wall"]) / s, 2),
                       "step_cpu_outside_decode_ms": round(1000 * ((acc["step_cpu"] - acc["decode_cpu"])) / s, 2),
                       "pool_wall_outside_steps_ms_per_step": round(1000 * (wall - acc["step_wall"]) / s, 1)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=8192)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--clients", default="4")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", choices=["long", "short"], default="long", help="as bench_vs_llama_server.py's")
    ap.add_argument("--peer", default=None, help="profile this llama-server binary instead")
    ap.add_argument("extra", nargs="*", help="more server arguments (after --)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lf-prof-"))
    if args.peer:
        srv = LlamaServer(Path(args.peer), ["-m", args.model, "-t", str(args.threads), "-c", str(args.ctx), "-np", str(args.slots), *args.extra],
                          work / "peer.log")
        snap = lambda: peer_snapshot(srv.proc.pid)  # noqa: E731
    else:
        srv = ProfiledServer(["-m", args.model, "-t", str(args.threads), "-c", str(args.ctx), "--parallel", str(args.slots), "--queue", "64",
                              *args.extra], work)
        snap = srv.snapshot
    try:
        run_clients(srv.url, srv.model, 1, 1, 8)  # warm-up
        for n in [int(c) for c in args.clients.split(",")]:
            for r in range(args.rounds):
                load = os.getloadavg()[0]
                a = snap()
                replies, wall = run_clients(srv.url, srv.model, n, 1, args.max_tokens, args.prompts)
                b = snap()
                d = diff(a, b, sum(x[1] for x in replies.values()), wall)
                print(json.dumps({"server": "llama-server" if args.peer else "localflash", "clients": n, "round": r, "load_1min": round(load, 2), **d}),
                      flush=True)
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
