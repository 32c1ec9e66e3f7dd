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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # leak_probe (--heap)

GREEDY = {"temperature": 0}  # the anthropic client takes no temperature argument of its own here
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
        from leak_probe import heap_dump, probe_env

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


def tool_result(c: int, k: int, turn: int) -> str:
    """~300 tokens of code, as a read_file tool returns it."""
    return "".join(f"def f{c}_{k}_{turn}_{i}(x, y):\n    return x * {i} + y - {turn}  # step {i}\n" for i in range(12))


class Agent:
    """One client's agent conversation: resent whole every turn, growing by a reply, a tool call and its result."""

    TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]

    def __init__(self, c: int, rng: random.Random):
        self.c, self.rng, self.k = c, rng, -1
        self.new()

    def new(self) -> None:
        self.k += 1
        self.route = self.rng.choice(["openai", "openai_stream", "anthropic", "anthropic_stream"])
        self.turns = 0
        task = f"Agent {self.c}.{self.k}: fix the failing tests; read the files you need."
        self.messages = [{"role": "user", "content": task}]  # Anthropic shape; to_openai() converts

    def to_openai(self) -> list[dict]:
        out = [{"role": "system", "content": "You are a coding agent."}]
        for m in self.messages:
            if isinstance(m["content"], str):
                out.append(m)
            elif m["role"] == "assistant":
                text, call = m["content"]
                out.append({"role": "assistant", "content": text["text"], "tool_calls": [{
                    "id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["input"])}}]})
            else:
                res = m["content"][0]
                out.append({"role": "tool", "tool_call_id": res["tool_use_id"], "content": res["content"]})
        return out

    def turn(self, client, ac, model: str, max_tokens: int, slot_ctx: int, agent: dict, lock) -> str | None:
        if self.route.startswith("openai"):
            tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
                     for t in self.TOOLS]
            ask = dict(model=model, messages=self.to_openai(), tools=tools, temperature=0, max_tokens=max_tokens)
            if self.route == "openai_stream":
                parts, finish, usage = [], None, None
                for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ask):
                    for c in ch.choices:
                        parts.append(c.delta.content or "")
                        finish = c.finish_reason or finish
                    usage = ch.usage or usage
                text = "".join(parts)
            else:
                r = client.chat.completions.create(**ask)
                text, finish, usage = r.choices[0].message.content or "", r.choices[0].finish_reason, r.usage
            if finish not in ("stop", "length", "tool_calls") or usage is None:
                return f"odd finish {finish!r} or no usage"
            prompt, cached = usage.prompt_tokens, (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
        else:
            ask = dict(model="any", system="You are a coding agent.", messages=self.messages, tools=self.TOOLS, extra_body=GREEDY, max_tokens=max_tokens)
            if self.route == "anthropic_stream":
                with ac.messages.stream(**ask) as s:
                    text = "".join(s.text_stream)
                    final = s.get_final_message()
            else:
                final = ac.messages.create(**ask)
                text = "".join(b.text for b in final.content if b.type == "text")
            if final.stop_reason not in ("end_turn", "max_tokens", "tool_use", "stop_sequence"):
                return f"odd stop_reason {final.stop_reason!r}"
            cached = final.usage.cache_read_input_tokens or 0
            prompt = final.usage.input_tokens + cached
        with lock:
            agent["turns"] += 1
            agent["conversations"] += self.turns == 0
            agent["longest_prompt"] = max(agent["longest_prompt"], prompt)
            agent["prompt_tokens"] += prompt
            agent["cached_tokens"] += cached
        self.turns += 1
        if prompt > slot_ctx // 2:
            self.new()
            return None
        call = {"type": "tool_use", "id": f"toolu_{self.c}_{self.k}_{self.turns}", "name": "read_file", "input": {"path": f"src/m{self.turns}.py"}}
        self.messages.append({"role": "assistant", "content": [{"type": "text", "text": text or "Reading."}, call]})
        self.messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                           "content": tool_result(self.c, self.k, self.turns)}]})
        return None


def one_message(ac, kind: str, prompt: str, max_tokens: int, greedy: dict) -> str | None:
    """One Anthropic /v1/messages request (whole, streamed, or left after 3 events); greedy text equals the OpenAI route's."""
    ask = dict(model="any", max_tokens=max_tokens, extra_body=GREEDY, messages=[{"role": "user", "content": prompt}])
    if kind == "msg_disconnect":
        with ac.messages.stream(**{**ask, "max_tokens": 400}) as s:
            for j, _ in enumerate(s):
                if j == 3:
                    break
        return None
    if kind == "msg_stream":
        with ac.messages.stream(**ask) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        if "".join(b.text for b in final.content if b.type == "text") != text:
            return "streamed text differs from the final message"
    else:
        final = ac.messages.create(**ask)
        text = "".join(b.text for b in final.content if b.type == "text")
    if not text or final.stop_reason not in ("end_turn", "max_tokens"):
        return f"empty or odd stop_reason {final.stop_reason!r}"
    want = greedy.setdefault(prompt, text)
    return None if text == want else f"greedy reply changed (messages route): {text!r} != {want!r}"


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
