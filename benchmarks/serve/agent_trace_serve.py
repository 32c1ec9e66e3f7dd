"""The agent trace through a real `localflash serve`: prompt tokens prefilled and time to first token per turn, routed vs not.

Four agents (``--agents``) run at once against ``--parallel 4`` slots, each over ``--turns`` turns,
each with a real ``openai`` client on loopback. Every turn resends the agent's whole history
(system prompt, task, then per turn the assistant's reply with a ``read_file`` tool call and the
tool's result: ~250 tokens of code), streamed, and asks for a fix that copies code from the last
file (the replies n-gram / prompt-lookup drafting can copy). Between turns an agent "runs its tool"
for ``--tool-s`` seconds (jittered, seeded), so other slots come free meanwhile, as with real agents.
Each server answers one short request before the trace (its first request also times the draft length).

The same trace runs twice on fresh servers: ``routed`` (the default ``--slot-prompt-similarity
0.5``: a request goes to the slot that holds its history) and ``not routed`` (``-sps 0``, as
llama-server's: an empty, else the least recently used free slot; a slot's own cache is still reused
as far as it matches). Per turn: prefilled = usage.prompt_tokens - cached_tokens (the tokens the
server decoded for the prompt), new = the history's growth since the agent's previous request less
that request's reply (what an ideal cache must still prefill), TTFT = request sent -> first streamed
content (client clock), and the server's prompt_ms. Prints a markdown table, writes ``--json``.

    .venv/bin/python benchmarks/serve/agent_trace_serve.py --turns 10                     # tiny random target, n-gram
    .venv/bin/python benchmarks/serve/agent_trace_serve.py --turns 10 \\
        -m ~/.cache/localflash/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --spec ngram --json docs/agent-trace-serve.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import openai

from localflash.testing.serve import LiveServer, tiny_models

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a source file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
SYSTEM = "You are a coding agent. Read files with read_file, then answer with the corrected code only."


def source_file(agent: int, turn: int) -> str:
    """~250 tokens of Python, different per agent and turn (the tool's result)."""
    name = ["parser", "cache", "router", "queue"][agent % 4]
    lines = [f"# src/{name}_{turn}.py", "from __future__ import annotations", "", f"class {name.title()}{turn}:"]
    lines += ["    def __init__(self, size: int):", "        self.size = size", "        self.items: list[int] = []", ""]
    for i in range(5):
        lines += [f"    def step_{i}(self, x: int) -> int:", f"        if x > {10 * i + turn}:",
                  f"            return x - {i + agent}", f"        return x * {i + 2} + self.size  # TODO: off by {i}", ""]
    return "\n".join(lines)


def run_agents(url: str, model: str, args, sps: float) -> list[list[dict]]:
    """Every agent's turns: [{prompt, cached, prefilled, new, ttft_s, prompt_ms, completion}] per agent."""
    out: list[list[dict]] = [[] for _ in range(args.agents)]
    errors: list[str] = []
    start = threading.Barrier(args.agents)

    def agent(a: int) -> None:
        rng = random.Random(args.seed * 100 + a)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        msgs = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Agent {a}: the tests in tests/test_{a}.py fail. Find the bugs and fix them."}]
        before = None  # (prompt tokens, reply tokens) of the previous turn
        start.wait()
        for t in range(args.turns):
            call_id = f"call_{a}_{t}"
            msgs += [{"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": f"src/file_{a}_{t}.py"})}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": source_file(a, t)},
                     {"role": "user", "content": f"Fix step_{t % 5} of that file: copy the class and correct the TODO line."}]
            t0 = time.perf_counter()
            ttft, parts, usage, tim = None, [], None, {}
            try:
                for ch in client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0, stream=True,
                                                         max_tokens=args.max_tokens, stream_options={"include_usage": True}):
                    for c in ch.choices:
                        d = c.delta
                        if ttft is None and (d.content or getattr(d, "reasoning_content", None) or d.tool_calls):
                            ttft = time.perf_counter() - t0
                        parts.append(d.content or "")
                    if ch.usage is not None:
                        usage, tim = ch.usage, (ch.model_extra or {}).get("timings") or {}
            except openai.APIError as e:
                errors.append(f"agent {a} turn {t}: {e}")
                return
            end = time.perf_counter() - t0
            cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
            new = usage.prompt_tokens if before is None else max(0, usage.prompt_tokens - before[0] - before[1])
            out[a].append({"turn": t + 1, "prompt": usage.prompt_tokens, "cached": cached, "prefilled": usage.prompt_tokens - cached,
                           "new": new, "ttft_s": round(ttft if ttft is not None else end, 4), "prompt_ms": round(tim.get("prompt_ms", 0.0), 1),
                           "completion": usage.completion_tokens, "reply_s": round(end, 3)})
            before = (usage.prompt_tokens, usage.completion_tokens)
            msgs.append({"role": "assistant", "content": "".join(parts)})
            msgs.append({"role": "user", "content": "Now read the next file."})
            time.sleep(args.tool_s * rng.uniform(0.5, 1.5))  # the agent runs its tool; other slots come free meanwhile

    threads = [threading.Thread(target=agent, args=(a,)) for a in range(args.agents)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise SystemExit(f"{len(errors)} request(s) failed ({'routed' if sps else 'not routed'}): {errors[:3]}")
    return out


def per_turn(runs: list[list[dict]], turns: int) -> list[dict]:
    rows = []
    for t in range(turns):
        got = [r[t] for r in runs if len(r) > t]
        rows.append({"turn": t + 1, "prefilled": sum(g["prefilled"] for g in got), "new": sum(g["new"] for g in got),
                     "prompt": sum(g["prompt"] for g in got), "ttft_s_mean": round(sum(g["ttft_s"] for g in got) / len(got), 4),
                     "ttft_s_max": max(g["ttft_s"] for g in got), "prompt_ms_sum": round(sum(g["prompt_ms"] for g in got), 1)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=4, help="server slots")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tool-s", type=float, default=0.5, help="seconds an agent spends on its tool between turns (jittered ±50%%)")
    ap.add_argument("-m", "--model", default=None, help="target GGUF (default: the tiny random target)")
    ap.add_argument("--pair", default=None, help="a models.toml pair instead of -m")
    ap.add_argument("--spec", default="ngram", help="--spec for the server (default ngram: prompt lookup copies code)")
    ap.add_argument("-c", "--ctx", type=int, default=32768, help="the unified KV pool's tokens, all slots together")
    ap.add_argument("-t", "--threads", default="0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lf-trace-"))
    if args.pair:
        load = ["--pair", args.pair]
    else:
        load = ["-m", args.model or tiny_models(work)[0]]
    result = {"turns": args.turns, "agents": args.agents, "parallel": args.parallel, "load": " ".join(map(str, load)),
              "spec": args.spec, "ctx": args.ctx, "max_tokens": args.max_tokens, "tool_s": args.tool_s, "load_avg": os.getloadavg()[0]}
    for label, sps in (("routed", 0.5), ("not_routed", 0.0)):
        server = LiveServer(*load, "--spec", args.spec, "-c", args.ctx, "--parallel", args.parallel, "-t", args.threads,
                            "--slot-prompt-similarity", sps, log=work / f"server-{label}.log")
        try:  # one short request first: a server's first request also times the draft length (calibrate_ms), not the trace's
            server.client().chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
            runs = run_agents(server.url, server.model, args, sps)
        finally:
            rc = server.stop()
        log = server.text()
        if rc != 0 or "Traceback" in log:
            raise SystemExit(f"the {label} server failed (exit {rc}); log: {server.log}")
        result[label] = {"per_turn": per_turn(runs, args.turns), "agents": runs}
    result["load_avg_end"] = os.getloadavg()[0]
    r, n = result["routed"]["per_turn"], result["not_routed"]["per_turn"]
    print(f"{args.agents} agents x {args.turns} turns, {result['load']}, --spec {args.spec}, --parallel {args.parallel}; load {result['load_avg']:.1f}")
    print("| turn | new tokens | prefilled, routed | prefilled, not routed | TTFT routed (mean / max) | TTFT not routed (mean / max) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for a, b in zip(r, n):
        print(f"| {a['turn']} | {a['new']} | {a['prefilled']} | {b['prefilled']} | {1000 * a['ttft_s_mean']:.0f} / {1000 * a['ttft_s_max']:.0f} ms "
              f"| {1000 * b['ttft_s_mean']:.0f} / {1000 * b['ttft_s_max']:.0f} ms |")
    tot = lambda rows, k: sum(x[k] for x in rows)  # noqa: E731
    print(f"| all | {tot(r, 'new')} | {tot(r, 'prefilled')} | {tot(n, 'prefilled')} | "
          f"{1000 * tot(r, 'ttft_s_mean') / len(r):.0f} ms | {1000 * tot(n, 'ttft_s_mean') / len(n):.0f} ms |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
