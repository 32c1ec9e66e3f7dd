#!/usr/bin/env python3
"""Several server configurations up at once, rotated rounds of C streamed clients: aggregate tok/s and thread CPU a token.

Each variant is ``NAME:ARGS``: a name starting with ``ls`` is llama-server (``-m MODEL -t T -c CTX -np SLOTS`` plus
ARGS), any other is ``localflash serve`` (``-m MODEL -t T -c CTX --parallel SLOTS --spec none`` plus ARGS); in ARGS,
``KEY=VALUE`` words with an upper-case KEY go into that server's environment (``lf300k:GOMP_SPINCOUNT=300000``).
Every round visits every server (rotated, every other round backwards); the first variant is the reference of the
ratios. ``--busy N`` keeps N busy-looping processes running through the rounds (a machine that also does other
work); without it, run it idle and note the load.

Per server and round: aggregate tok/s (the real ``openai`` client, greedy, long-essay prompts so every reply runs
to ``--tokens``) and, from /proc, its threads' CPU seconds a generated token: the two busiest (the decode: the
calling thread and its OpenMP partner at ``-t 2``; "main − 2nd" is the caller's work beyond its partner's, its
host work between decodes) and the rest (HTTP, workers).

    .venv/bin/python benchmarks/serve/server_variants.py -m ~/.cache/localflash/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --clients 4 --rounds 6 ls: lf: lf300k:GOMP_SPINCOUNT=300000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_vs_llama_server import LlamaServer, run_clients, thread_cpu  # this script's folder is sys.path[0]

from localflash.testing.serve import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def start(spec: str, a, work: Path):
    name, _, rest = spec.partition(":")
    env, args = dict(os.environ), []
    for w in rest.split():
        key, eq, value = w.partition("=")
        if eq and key.isupper():
            env[key] = value
        else:
            args.append(w)
    if name.startswith("ls"):
        return name, LlamaServer(Path(a.peer), ["-m", a.model, "-t", str(a.threads), "-c", str(a.ctx), "-np", str(a.slots), *args],
                                 work / f"{name}.log")  # (its environment: this process's)
    return name, LiveServer("-m", a.model, "-t", a.threads, "-c", a.ctx, "--parallel", a.slots, "--spec", "none", *args,
                            log=work / f"{name}.log", env=env)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME:ARGS (NAME ls*: llama-server; else localflash serve)")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--peer", default=str(ROOT / "peer" / "bin" / "llama-server"))
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=8192)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes running through the rounds")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.model = str(Path(a.model).expanduser())
    work = Path(tempfile.mkdtemp(prefix="lf-variants-"))
    servers: dict = {}
    hogs: list = []
    res: dict = {}
    try:
        for spec in a.variants:
            name, server = start(spec, a, work)
            servers[name] = server
        for s in servers.values():  # warm-up: one round's requests, untimed
            run_clients(s.url, s.model, a.clients, 1, 24, "long")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
        keys = list(servers)
        res = {k: [] for k in keys}
        for r in range(a.rounds):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            for k in (order if r % 2 == 0 else order[::-1]):
                s = servers[k]
                before = thread_cpu(s.proc.pid)
                replies, wall = run_clients(s.url, s.model, a.clients, 1, a.tokens, "long")
                after = thread_cpu(s.proc.pid)
                d = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
                tokens = sum(x[1] for x in replies.values())
                load = os.getloadavg()[0]
                res[k].append({"tok_s": tokens / wall, "tokens": tokens, "main": d[0], "second": d[1], "rest": sum(d[2:]), "load": load})
                print(f"round {r} {k}: {tokens / wall:.2f} tok/s, decode threads {d[0]:.2f} + {d[1]:.2f} s, rest {sum(d[2:]):.2f} s, "
                      f"load {load:.2f}", flush=True)
    finally:
        for h in hogs:
            h.kill()
        for s in servers.values():
            s.stop()
    ref = next(iter(res))
    summary = {}
    for k, runs in res.items():
        ratio = [x["tok_s"] / y["tok_s"] for x, y in zip(runs, res[ref])]
        per = lambda f: 1000 * statistics.median(f(x) / x["tokens"] for x in runs)  # noqa: E731
        summary[k] = {"tok_s": statistics.median(x["tok_s"] for x in runs), "ratio": statistics.median(ratio),
                      "ratio_range": [min(ratio), max(ratio)], "cpu_ms_per_token": per(lambda x: x["main"] + x["second"] + x["rest"]),
                      "main_minus_second_ms_per_token": per(lambda x: x["main"] - x["second"]), "rest_ms_per_token": per(lambda x: x["rest"])}
        f = summary[k]
        print(f"{k}: median {f['tok_s']:.2f} tok/s, vs {ref} {f['ratio']:.3f} ({f['ratio_range'][0]:.3f}-{f['ratio_range'][1]:.3f}); "
              f"CPU ms a token {f['cpu_ms_per_token']:.2f} (main - 2nd {f['main_minus_second_ms_per_token']:.2f}, rest {f['rest_ms_per_token']:.2f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"settings": vars(a), "summary": summary, "rounds": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
