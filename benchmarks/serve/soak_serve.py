"""Soak `localflash serve`: requests from one or many clients (mixed streaming, stop strings, disconnects); RSS and failures.

Every request is checked: status 200, a non-empty reply, the finish reason it
must have, no stop string in the text, and greedy replies identical every time
the same prompt comes back (whatever the cache held before). A disconnect
closes its stream after 3 chunks; the request after it must still succeed.
RSS is read from /proc for the server process after warm-up and at the end.

With ``--clients N`` (and ``--minutes M``) N client threads run at once against ``--parallel``
slots, each opening a new connection for every request, on both APIs: the OpenAI routes (the
``openai`` client) and the Anthropic ``/v1/messages`` route (the ``anthropic`` client, streamed
and whole); some leave mid-stream and come back, some send a prompt larger than a slot (a 400
by design on either route, counted apart), and each client also runs an agent conversation
that grows turn by turn by a tool call and a tool result of a few hundred tokens, resent whole
every turn (on one route per conversation; a new one once it fills half a slot). The server
runs with ``--exact`` so greedy replies must still be identical whatever ran beside them (and
the Anthropic route's greedy text equals the OpenAI chat route's for the same prompt). RSS is
sampled every 30 s; the summary gives the least-squares slope after warm-up in MiB/min.

    .venv/bin/python benchmarks/serve/soak_serve.py --requests 300            # tiny target + DFlash
    .venv/bin/python benchmarks/serve/soak_serve.py --requests 300 --pair demo
    .venv/bin/python benchmarks/serve/soak_serve.py --clients 8 --minutes 30  # 8 clients on 8 slots, both APIs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
from localflash.testing.serve import LiveServer, tiny_models  # noqa: E402
from localflash.testing.soak import TOPICS, Agent, one, one_message



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30, help="requests before the start RSS is taken")
    ap.add_argument("--pair", default=None, help="a models.toml pair (default: the tiny test models)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clients", type=int, default=1, help="client threads at once (more than 1: see --minutes, --parallel)")
    ap.add_argument("--minutes", type=float, default=10.0, help="with --clients > 1: how long the clients keep sending")
    ap.add_argument("--parallel", type=int, default=None, help="server slots (default: --clients)")
    ap.add_argument("--warmup-s", type=float, default=60.0, help="with --clients > 1: seconds before the start RSS is taken")
    ap.add_argument("--slot-ctx", type=int, default=2048, help="with --clients > 1: tokens per slot (-c is this times the slots)")
    ap.add_argument("--heap", action="store_true", help="with --clients > 1: at each RSS sample the server also reports its C heap "
                    "(glibc malloc_stats over all arenas: in-use and system bytes) and its live Python objects (leak_probe.py's hook)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server's environment (e.g. MALLOC_ARENA_MAX=2)")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = ap.parse_args()
    if args.clients > 1:
        return concurrent_soak(args)

    work = Path(tempfile.mkdtemp(prefix="lf-soak-"))
    if args.pair:
        load = ["--pair", args.pair]
    else:
        target, drafter = tiny_models(work)
        load = ["-m", str(target), "--drafter", str(drafter)]
    server = LiveServer(*load, "-t", args.threads, "-c", "2048", log=work / "server.log")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    rng = random.Random(args.seed)
    greedy: dict[str, str] = {}
    failures: list[str] = []
    kinds: dict[str, int] = {}
    rss_start = None
    t0 = time.perf_counter()
    try:
        for i in range(args.requests):
            if i == args.warmup:
                rss_start = server.rss_mib()
            kind = rng.choice(["chat", "chat_stream", "stop", "stop_stream", "disconnect", "completion"])
            kinds[kind] = kinds.get(kind, 0) + 1
            prompt = f"Write two sentences about {rng.choice(TOPICS)}."
            try:
                problem = one(client, server.model, kind, prompt, args.max_tokens, greedy)
            except Exception as e:  # a failed request is a finding, not a crash of the soak
                problem = f"{type(e).__name__}: {e}"
            if problem:
                failures.append(f"#{i} {kind}: {problem}")
        wall = time.perf_counter() - t0
        rss_end, peak = server.rss_mib(), server.peak_rss_mib()
        cancelled = server.metric("localflash:requests_total").get('{finish_reason="cancelled"}', 0)
    finally:
        rc = server.stop()
    log = server.log.read_text()
    summary = {
        "requests": args.requests, "kinds": kinds, "failures": len(failures), "first_failures": failures[:5],
        "rss_mib_after_warmup": round(rss_start or 0, 1), "rss_mib_end": round(rss_end, 1), "peak_rss_mib": round(peak, 1),
        "cancelled_generations": int(cancelled), "tracebacks_in_log": log.count("Traceback"), "server_exit": rc,
        "wall_s": round(wall, 1), "load": " ".join(load),
    }
    print(json.dumps(summary, indent=1))
    return 0 if not failures and rc == 0 else 1


def concurrent_soak(args) -> int:
    """``args.clients`` threads for ``args.minutes``, each request on a new connection; RSS sampled every 30 s."""
    work = Path(tempfile.mkdtemp(prefix="lf-soak-"))
    if args.pair:
        load = ["--pair", args.pair]
    else:
        target, drafter = tiny_models(work)
        load = ["-m", str(target), "--drafter", str(drafter)]
    slots = args.parallel or args.clients
    env = dict(os.environ)
    if args.heap:
        from localflash.testing.heap import heap_dump, probe_env

        env = probe_env(work, 0)
    env.update(e.split("=", 1) for e in args.env)
    server = LiveServer(*load, "-t", args.threads, "-c", str(args.slot_ctx * slots), "--parallel", str(slots), "--exact", "--queue", "64",
                        log=work / "server.log", env=env)
    heap: list[tuple[float, float, float, int]] = []  # (s, C heap in use MiB, C heap system MiB, live Python objects)
    lock = threading.Lock()
    failures: list[str] = []
    kinds: dict[str, int] = {}
    by_design = {"400_too_long": 0, "400_too_long_messages": 0}
    agent = {"turns": 0, "conversations": 0, "longest_prompt": 0, "prompt_tokens": 0, "cached_tokens": 0}
    rss: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    deadline = t0 + 60 * args.minutes

    class Shared(dict):  # the greedy replies, shared by the clients (and by both APIs)
        def setdefault(self, k, v):
            with lock:
                return super().setdefault(k, v)

    shared = Shared()
    too_long = "stone " * (args.slot_ctx + 200)

    def client_loop(c: int) -> None:
        rng = random.Random(args.seed * 1000 + c)
        conv = Agent(c, rng)
        i = 0
        while time.perf_counter() < deadline:
            kind = rng.choice(["chat", "chat_stream", "stop", "stop_stream", "disconnect", "completion", "too_long",
                               "msg", "msg_stream", "msg_disconnect", "msg_too_long", "agent", "agent", "agent"])
            with lock:
                kinds[kind] = kinds.get(kind, 0) + 1
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)  # a new connection
            ac = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=300)
            prompt = f"Write two sentences about {rng.choice(TOPICS)}."
            try:
                if kind == "too_long":
                    try:
                        client.completions.create(model=server.model, prompt=too_long, max_tokens=4)
                        problem = "a prompt larger than a slot was not refused"
                    except openai.BadRequestError as e:
                        problem = None if "one slot holds" in str(e) else f"400 without the slot share: {e}"
                        with lock:
                            by_design["400_too_long"] += problem is None
                elif kind == "msg_too_long":
                    try:
                        ac.messages.create(model="any", max_tokens=4, messages=[{"role": "user", "content": too_long}])
                        problem = "a message larger than a slot was not refused"
                    except anthropic.BadRequestError as e:
                        shaped = e.body.get("type") == "error" and e.body["error"]["type"] == "invalid_request_error"
                        problem = None if shaped and "holds" in str(e) else f"400 not Anthropic-shaped or without the size: {e}"
                        with lock:
                            by_design["400_too_long_messages"] += problem is None
                elif kind == "agent":
                    problem = conv.turn(client, ac, server.model, args.max_tokens, args.slot_ctx, agent, lock)
                elif kind.startswith("msg"):
                    problem = one_message(ac, kind, prompt, args.max_tokens, shared)
                else:
                    problem = one(client, server.model, kind, prompt, args.max_tokens, shared)
            except Exception as e:  # noqa: BLE001 (a finding)
                problem = f"{type(e).__name__}: {e}"
            finally:
                client.close()
                ac.close()
            if problem:
                with lock:
                    failures.append(f"client {c} #{i} {kind}: {problem}")
            i += 1

    threads = [threading.Thread(target=client_loop, args=(c,), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    try:
        next_sample = time.perf_counter()
        while any(t.is_alive() for t in threads):
            if time.perf_counter() >= next_sample:
                rss.append((round(time.perf_counter() - t0, 1), round(server.rss_mib(), 1)))
                if args.heap:
                    d = heap_dump(server.proc, work, len(heap))
                    heap.append((rss[-1][0], round(d["heap"]["in_use"] / 2**20, 2), round(d["heap"]["system"] / 2**20, 2), sum(d["types"].values())))
                next_sample += 30.0
            for t in threads:
                t.join(0.5 / len(threads))
        wall = time.perf_counter() - t0
        rss.append((round(wall, 1), round(server.rss_mib(), 1)))
        still = httpx.get(server.url + "/health").json()
        finished = server.metric("localflash:requests_total")
        errors = server.metric("localflash:errors_total")
    finally:
        rc = server.stop()
    log = server.log.read_text()
    after = [(t, m) for t, m in rss if t >= args.warmup_s]
    summary = {
        "clients": args.clients, "slots": slots, "slot_ctx": args.slot_ctx, "minutes": args.minutes, "requests": sum(kinds.values()),
        "kinds": kinds, "agent": agent, "failures": len(failures), "first_failures": failures[:5], "by_design_4xx": by_design,
        "rss_mib_after_warmup": after[0][1] if after else None, "rss_mib_end": rss[-1][1],
        "rss_mib_max_after_warmup": max((m for _, m in after), default=None),
        "rss_slope_mib_per_min_after_warmup": slope(after), "env": args.env, "rss_samples": rss, "health_at_end": still,
        "finished_by_reason": finished, "error_responses": errors,
        "tracebacks_in_log": log.count("Traceback"), "server_exit": rc, "wall_s": round(wall, 1), "load": " ".join(load),
    }
    if heap:
        late = [h for h in heap if h[0] >= args.warmup_s]
        summary["heap_slopes_mib_per_min_after_warmup"] = {"c_in_use": slope([(h[0], h[1]) for h in late]),
                                                           "c_system": slope([(h[0], h[2]) for h in late])}
        summary["python_objects_after_warmup_and_end"] = [late[0][3], late[-1][3]] if late else None
        summary["heap_samples"] = heap
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rss_samples", "heap_samples")}, indent=1))
    print("rss_samples (s, MiB):", json.dumps(rss))
    if heap:
        print("heap_samples (s, C in use MiB, C system MiB, Python objects):", json.dumps(heap))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if not failures and rc == 0 and not summary["tracebacks_in_log"] else 1


def slope(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) samples, in MiB per minute."""
    if len(samples) < 2:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mm = sum(m for _, m in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return round(60 * sum((t - mt) * (m - mm) for t, m in samples) / var, 4) if var else None


if __name__ == "__main__":
    sys.exit(main())
