"""Where `localflash serve`'s memory grows: heap dumps of the live server between rounds of the soak's requests.

The server runs as ``localflash serve`` (the tiny target + DFlash, ``--parallel 4 --exact``) in its
own process, with a ``sitecustomize`` on its path that starts tracemalloc and, on SIGUSR1, writes
what it holds: a tracemalloc snapshot, the live Python objects by type, glibc's ``malloc_stats``
over every arena (system and in-use bytes: llama.cpp's C/C++ objects and Python's larger blocks) and
VmRSS. Client threads here send the soak's mix (both APIs, streamed and whole, disconnects, 400s,
agent histories). After ``--warmup`` requests and after each round of ``--requests`` more, the server
dumps; each round is compared with the one before: RSS, the C heap in use and the heap's system
bytes (what fragmentation keeps), Python's traced bytes, and the allocation sites that grew.
A leak is a site or a type that grows round after round; a heap whose in-use bytes stay flat while
its system bytes (and RSS) grow is fragmentation, not a leak.

    .venv/bin/python benchmarks/serve/leak_probe.py --warmup 60 --requests 150 --rounds 3
    .venv/bin/python benchmarks/serve/leak_probe.py ... --env MALLOC_ARENA_MAX=2   # the same with a setting
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--requests", type=int, default=150, help="requests per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--sites", type=int, default=5, help="allocation sites shown per round")
    ap.add_argument("--trim", action="store_true", help="at each dump the server also calls malloc_trim(0) and reads RSS again")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server's environment")
    ap.add_argument("--spec", default=None, help="--spec for the tiny target (default: its DFlash drafter)")
    args = ap.parse_args()

    import anthropic
    import openai

    import localflash.testing.soak as soak
    from localflash.testing.heap import heap_dump, probe_env
    from localflash.testing.serve import LiveServer, tiny_models

    work = Path(tempfile.mkdtemp(prefix="lf-leak-"))
    target, drafter = tiny_models(work)
    env = {**probe_env(work, args.frames), **dict(e.split("=", 1) for e in args.env), **({"LF_PROBE_TRIM": "1"} if args.trim else {})}
    load = ["--spec", args.spec] if args.spec else ["--drafter", drafter]
    server = LiveServer("-m", target, *load, "-t", "1", "-c", str(2048 * 4), "--parallel", "4", "--exact", "--queue", "64",
                        log=work / "server.log", env=env)
    url, model = server.url, server.model
    lock = threading.Lock()
    sent = [0]
    problems: list[str] = []
    greedy: dict = {}
    agent_stats = {"turns": 0, "conversations": 0, "longest_prompt": 0, "prompt_tokens": 0, "cached_tokens": 0}

    def drive(n: int, seed: int) -> None:
        goal = sent[0] + n

        def loop(c: int) -> None:
            rng = random.Random(seed * 100 + c)
            conv = soak.Agent(c + 10 * seed, rng)
            while True:
                with lock:
                    if sent[0] >= goal:
                        return
                    sent[0] += 1
                kind = rng.choice(["chat", "chat_stream", "stop", "disconnect", "completion", "too_long",
                                   "msg", "msg_stream", "msg_disconnect", "msg_too_long", "agent", "agent", "json"])
                oc = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
                ac = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=300)
                prompt = f"Write two sentences about {rng.choice(soak.TOPICS)}."
                try:
                    if kind == "too_long":
                        try:
                            oc.completions.create(model=model, prompt="stone " * 2300, max_tokens=4)
                        except openai.BadRequestError:
                            pass
                    elif kind == "msg_too_long":
                        try:
                            ac.messages.create(model="any", max_tokens=4, messages=[{"role": "user", "content": "stone " * 2300}])
                        except anthropic.BadRequestError:
                            pass
                    elif kind == "json":  # a grammar: drafts are checked on clones of its sampler
                        r = oc.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=24,
                                                       temperature=0, response_format={"type": "json_object"})
                        p = None if r.choices[0].finish_reason in ("stop", "length") else f"json: {r.choices[0]!r}"
                    elif kind == "agent":
                        p = conv.turn(oc, ac, model, 32, 2048, agent_stats, lock)
                    elif kind.startswith("msg"):
                        p = soak.one_message(ac, kind, prompt, 32, greedy)
                    else:
                        p = soak.one(oc, model, kind, prompt, 32, greedy)
                    if kind not in ("too_long", "msg_too_long") and p:
                        problems.append(p)
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{kind}: {type(e).__name__}: {e}")
                finally:
                    oc.close()
                    ac.close()

        ts = [threading.Thread(target=loop, args=(c,)) for c in range(args.clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        time.sleep(1.0)  # disconnected generations end

    def dump(i: int) -> dict:
        return heap_dump(server.proc, work, i)

    try:
        drive(args.warmup, 1)
        points = [dump(0)]
        for rnd in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            drive(args.requests, rnd + 1)
            wall = time.perf_counter() - t0
            points.append(dump(rnd))
            report(points[-2], points[-1], rnd, args, wall, problems)
    finally:
        rc = server.stop()
    print(f"\nserver exit {rc}, tracebacks in its log: {server.text().count('Traceback')}, load: {os.getloadavg()[0]:.1f}")
    return 0


def report(a: dict, b: dict, rnd: int, args, wall: float, problems: list[str]) -> None:
    mib = 2**20
    print(f"\n=== round {rnd}: {args.requests} requests, {wall:.0f} s, {len(problems)} problem(s) so far {problems[:3]}")
    print(f"RSS {a['rss_kib'] / 1024:.1f} -> {b['rss_kib'] / 1024:.1f} MiB ({(b['rss_kib'] - a['rss_kib']) / 1024:+.2f}); "
          f"C heap (all {b['heap']['arenas']} arenas) in use {a['heap']['in_use'] / mib:.2f} -> {b['heap']['in_use'] / mib:.2f} MiB "
          f"({(b['heap']['in_use'] - a['heap']['in_use']) / mib:+.2f}), system {a['heap']['system'] / mib:.2f} -> {b['heap']['system'] / mib:.2f} MiB "
          f"({(b['heap']['system'] - a['heap']['system']) / mib:+.2f}); Python traced {(b['traced'] - a['traced']) / mib:+.3f} MiB")
    maps = sorted(((k, b["maps"].get(k, 0) - a["maps"].get(k, 0)) for k in set(a["maps"]) | set(b["maps"])), key=lambda kv: -abs(kv[1]))
    print("RSS by mapping, KiB that changed (#: mappings):", [kv for kv in maps if kv[1]][:10])
    if b.get("rss_after_trim_kib"):
        print(f"RSS after malloc_trim(0): {a['rss_after_trim_kib'] / 1024:.1f} -> {b['rss_after_trim_kib'] / 1024:.1f} MiB "
              f"({(b['rss_after_trim_kib'] - a['rss_after_trim_kib']) / 1024:+.2f}; trimming gave back {(b['rss_kib'] - b['rss_after_trim_kib']) / 1024:.1f})")
    print("live GrammarState (one llama.cpp grammar sampler each):", a["types"].get("GrammarState", 0), "->", b["types"].get("GrammarState", 0))
    pa, pb = a["pymalloc"], b["pymalloc"]
    print("pymalloc:", {k: (pa[k], pb[k]) for k in pb})
    grew = sorted(((k, v - a["types"].get(k, 0)) for k, v in b["types"].items() if v - a["types"].get(k, 0) > 0), key=lambda kv: -kv[1])
    print("live Python objects that grew:", grew[:10])
    if not Path(b["snap"]).exists():
        return
    s1, s2 = tracemalloc.Snapshot.load(str(a["snap"])), tracemalloc.Snapshot.load(str(b["snap"]))
    filt = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    for d in [d for d in s2.filter_traces(filt).compare_to(s1.filter_traces(filt), "traceback") if d.size_diff > 0][: args.sites]:
        print(f"+{d.size_diff / 1024:.1f} KiB in {d.count_diff:+d} blocks:")
        for line in d.traceback.format(limit=args.frames)[-8:]:
            print("   ", line)


if __name__ == "__main__":
    sys.exit(main())
