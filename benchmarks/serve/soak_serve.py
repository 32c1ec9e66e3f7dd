"""Soak `localflash serve`: requests from one or many clients (mixed streaming, stop strings, disconnects); RSS and failures.

Every request is checked: status 200, a non-empty reply, the finish reason it
must have, no stop string in the text, and greedy replies identical every time
the same prompt comes back (whatever the cache held before). A disconnect
closes its stream after 3 chunks; the request after it must still succeed.
RSS is read from /proc for the server process after warm-up and at the end.

With ``--clients N`` (and ``--minutes M``) N client threads run at once against ``--parallel``
slots, each opening a new connection for every request, some leaving mid-stream and coming
back, some sending a prompt larger than a slot (a 400 by design, counted apart); the server
runs with ``--exact`` so greedy replies must still be identical whatever ran beside them.
RSS is sampled every 30 s.

    .venv/bin/python benchmarks/serve/soak_serve.py --requests 300            # tiny target + DFlash
    .venv/bin/python benchmarks/serve/soak_serve.py --requests 300 --pair demo
    .venv/bin/python benchmarks/serve/soak_serve.py --clients 8 --minutes 10  # 8 clients on 8 slots
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
from localflash.testing.serve import LiveServer, tiny_models  # noqa: E402

TOPICS = ["the sea", "a mountain", "bread", "a library", "rain", "a city at night", "bicycles", "tea"]


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
    server = LiveServer(*load, "-t", args.threads, "-c", str(1024 * slots), "--parallel", str(slots), "--exact", "--queue", "64",
                        log=work / "server.log")
    lock = threading.Lock()
    failures: list[str] = []
    kinds: dict[str, int] = {}
    by_design = {"400_too_long": 0}
    rss: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    deadline = t0 + 60 * args.minutes

    class Shared(dict):  # the greedy replies, shared by the clients
        def setdefault(self, k, v):
            with lock:
                return super().setdefault(k, v)

    shared = Shared()

    def client_loop(c: int) -> None:
        rng = random.Random(args.seed * 1000 + c)
        i = 0
        while time.perf_counter() < deadline:
            kind = rng.choice(["chat", "chat_stream", "stop", "stop_stream", "disconnect", "completion", "too_long"])
            with lock:
                kinds[kind] = kinds.get(kind, 0) + 1
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)  # a new connection
            prompt = f"Write two sentences about {rng.choice(TOPICS)}."
            try:
                if kind == "too_long":
                    try:
                        client.completions.create(model=server.model, prompt="stone " * 1500, max_tokens=4)
                        problem = "a prompt larger than a slot was not refused"
                    except openai.BadRequestError as e:
                        problem = None if "one slot holds" in str(e) else f"400 without the slot share: {e}"
                        with lock:
                            by_design["400_too_long"] += problem is None
                else:
                    problem = one(client, server.model, kind, prompt, args.max_tokens, shared)
            except Exception as e:  # noqa: BLE001 (a finding)
                problem = f"{type(e).__name__}: {e}"
            finally:
                client.close()
            if problem:
                with lock:
                    failures.append(f"client {c} #{i} {kind}: {problem}")
            i += 1

    threads = [threading.Thread(target=client_loop, args=(c,), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            rss.append((round(time.perf_counter() - t0, 1), round(server.rss_mib(), 1)))
            for t in threads:
                t.join(max(0.0, 30.0 / len(threads)))
        wall = time.perf_counter() - t0
        rss.append((round(wall, 1), round(server.rss_mib(), 1)))
        still = httpx.get(server.url + "/health").json()
        finished = server.metric("localflash:requests_total")
        errors = server.metric("localflash:errors_total")
    finally:
        rc = server.stop()
    log = server.log.read_text()
    after = [m for t, m in rss if t >= args.warmup_s]
    summary = {
        "clients": args.clients, "slots": slots, "minutes": args.minutes, "requests": sum(kinds.values()), "kinds": kinds,
        "failures": len(failures), "first_failures": failures[:5], "by_design_4xx": by_design,
        "rss_mib_after_warmup": after[0] if after else None, "rss_mib_end": rss[-1][1], "rss_mib_max_after_warmup": max(after, default=None),
        "rss_samples": rss, "health_at_end": still, "finished_by_reason": finished, "error_responses": errors,
        "tracebacks_in_log": log.count("Traceback"), "server_exit": rc, "wall_s": round(wall, 1), "load": " ".join(load),
    }
    print(json.dumps(summary, indent=1))
    return 0 if not failures and rc == 0 and not summary["tracebacks_in_log"] else 1


def one(client, model: str, kind: str, prompt: str, max_tokens: int, greedy: dict) -> str | None:
    """Send one request of ``kind``; return what is wrong with its answer, or None."""
    messages = [{"role": "user", "content": prompt}]
    base = dict(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
    if kind == "completion":
        r = client.completions.create(model=model, prompt=prompt + "\n", temperature=0.8, seed=1, max_tokens=max_tokens)
        c = r.choices[0]
        if c.finish_reason == "stop" and not c.text and r.usage.completion_tokens == 0:
            return None  # the model's first sampled token ended the text: an empty completion is its answer
        return None if c.text and c.finish_reason in ("stop", "length") else f"empty or odd: {c!r} {r.usage!r}"
    if kind == "disconnect":
        s = client.chat.completions.create(stream=True, **{**base, "max_tokens": 400})
        for j, _ in enumerate(s):
            if j == 2:
                break
        s.close()
        return None
    if kind in ("chat", "chat_stream"):
        text, finish = _chat(client, base, kind == "chat_stream")
        if not text or finish not in ("stop", "length"):
            return f"empty or odd finish {finish!r}"
        want = greedy.setdefault(prompt, text)
        return None if text == want else f"greedy reply changed: {text!r} != {want!r}"
    # stop strings: cut the known greedy reply at a word of its second half
    want = greedy.get(prompt)
    if want is None:
        want = greedy.setdefault(prompt, _chat(client, base, False)[0])
    words = [w for w in want[len(want) // 2:].split() if len(w) > 2]
    if not words:
        return None
    stop = words[0]
    text, finish = _chat(client, {**base, "stop": [stop]}, kind == "stop_stream")
    if stop in text:
        return f"stop string {stop!r} in the reply"
    return None if text == want[: want.index(stop)] and finish == "stop" else f"cut wrong: {text!r} (stop {stop!r}, finish {finish})"


def _chat(client, args: dict, stream: bool) -> tuple[str, str | None]:
    if not stream:
        r = client.chat.completions.create(**args)
        return r.choices[0].message.content or "", r.choices[0].finish_reason
    parts, finish = [], None
    for ch in client.chat.completions.create(stream=True, **args):
        for c in ch.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(parts), finish


if __name__ == "__main__":
    sys.exit(main())
