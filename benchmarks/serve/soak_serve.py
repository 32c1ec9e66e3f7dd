"""Soak `localflash serve`: N sequential requests (mixed streaming, stop strings, disconnects); RSS and failures.

Every request is checked: status 200, a non-empty reply, the finish reason it
must have, no stop string in the text, and greedy replies identical every time
the same prompt comes back (whatever the cache held before). A disconnect
closes its stream after 3 chunks; the request after it must still succeed.
RSS is read from /proc for the server process after warm-up and at the end.

    .venv/bin/python benchmarks/serve/soak_serve.py --requests 300            # tiny target + DFlash
    .venv/bin/python benchmarks/serve/soak_serve.py --requests 300 --pair demo
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

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
    args = ap.parse_args()

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
