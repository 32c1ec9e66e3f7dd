"""Concurrent streams against `localflash serve`: slots (--parallel N) vs the FIFO server (--parallel 1), per drafter.

For each mode (``none`` = plain, then each drafter) two real servers on loopback: the FIFO
server (``--parallel 1``) and the slot server (``--parallel SLOTS``), all of them up at once.
For each stream count S (1, 2, 4, 8) S real `openai` clients send REQUESTS chat requests each,
greedy, all at once, to one server after the other, ROUNDS times round (interleaved, so a
machine's drift hits every server alike); each server's best round is reported, with every
round's aggregate in the JSON rows, and each ratio is the median over rounds of the two
servers' aggregates in the same round.
Aggregate tok/s = completion tokens of all S streams / wall time of the run; per-stream tok/s =
a request's completion tokens / its latency as the client sees it (queueing included, which is
where the FIFO server loses), averaged. ``same`` counts replies equal to the FIFO server's reply
to the same request (with --exact every one must be; ``--check`` then fails on a difference).
The 1-minute load average is recorded before each figure: the machine may be shared.

``--quant Q4_0`` serves the pair's target requantized to that type (with the pair's drafter),
made with llama.cpp's quantizer on first use and cached where ``derive:`` drafters are
(``~/.cache/localflash/derived/<target>.<TYPE>.gguf``). Why Q4_0 here: ggml's CPU backend
multiplies the demo file's Q4_1 weights row by row, so batching slots cannot pay on it, while
Q4_0 goes through llamafile's sgemm (docs/benchmarks.md, "Parallel slots").

    .venv/bin/python benchmarks/serve/bench_parallel.py --pair demo --modes none,ngram,dflash --json out.json
    .venv/bin/python benchmarks/serve/bench_parallel.py --pair demo --quant Q4_0 --modes none,ngram,dflash --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

from localflash.errors import LocalflashError
from localflash.testing.serve import LiveServer

TOPICS = ["the sea", "a mountain", "bread", "a library", "rain", "a city at night", "bicycles", "tea",
          "a lighthouse", "winter", "a market", "trains", "an old clock", "the moon", "gardens", "a river"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--model", default=None, help="a target file instead of the pair's (e.g. the pair's target requantized)")
    ap.add_argument("--drafter", default=None, help="with --model: the drafter file")
    ap.add_argument("--quant", default=None, help="serve the target (the pair's, or --model) requantized to this type, e.g. Q4_0 "
                    "(made on first use, cached under ~/.cache/localflash/derived)")
    ap.add_argument("--modes", default="none,ngram,dflash")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="requests each stream sends, one after the other")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--ctx", type=int, default=8192, help="the slot server's context (each slot: ctx / slots); the FIFO server gets one slot's share")
    ap.add_argument("--exact", action="store_true", help="serve with --exact (byte-exact greedy; slower)")
    ap.add_argument("--check", action="store_true", help="fail unless every reply equals the FIFO server's (use with --exact)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every server per stream count, interleaved; the best is reported")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quant:
        args.model, args.drafter = requantized(args)
    streams = [int(s) for s in args.streams.split(",")]
    work = Path(tempfile.mkdtemp(prefix="lf-par-"))
    rows, problems = [], []
    servers: dict[tuple[str, int], LiveServer] = {}
    try:
        for mode in args.modes.split(","):  # every server up at once (an idle one waits on a condition: no CPU)
            files = ["-m", args.model] + (["--drafter", args.drafter] if args.drafter else []) if args.model else ["--pair", args.pair]
            base = [*files, "--spec", mode, "-t", args.threads] + (["--exact"] if args.exact else [])
            for parallel in (1, args.slots):
                ctx = args.ctx // args.slots * (1 if parallel == 1 else args.slots)
                server = servers[(mode, parallel)] = LiveServer(*base, "-c", str(ctx), "--parallel", str(parallel), "--queue", "64",
                                                               log=work / f"{mode}-{parallel}.log")
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
                _chat(client, server.model, "Say hello.", 8)  # warm-up (and the adaptive policy's calibration)
        for s in streams:
            runs: dict[tuple[str, int], list] = {key: [] for key in servers}
            for _round in range(args.rounds):  # interleaved: every server once a round, so drift hits them alike
                for key, server in servers.items():
                    load = os.getloadavg()[0]
                    cpu0, d0 = cpu_seconds(server.proc.pid), draft_counts(server)
                    replies, wall = _run(server, s, args.requests, args.max_tokens)
                    d1 = draft_counts(server)
                    runs[key].append((replies, wall, load, cpu_seconds(server.proc.pid) - cpu0, d1[0] - d0[0], d1[1] - d0[1]))
            for (mode, parallel), got in runs.items():
                replies, wall, load, _cpu, _d, _a = max(got, key=lambda r: sum(n for _, n, _ in r[0].values()) / r[1])  # the best round
                tokens = sum(n for _, n, _ in replies.values())
                per_stream = sum(n / t for _, n, t in replies.values() if t > 0) / len(replies)
                same = None
                if parallel != 1:
                    reference = {k: text for k, (text, _, _) in runs[(mode, 1)][0][0].items()}  # the FIFO server's first round
                    same = sum(reference.get(k) == text for r in got for k, (text, _, _) in r[0].items())
                    if args.check and same != len(got) * len(replies):
                        problems.append(f"{mode} at {s} streams: {len(got) * len(replies) - same} replies differ from the FIFO server's")
                row = {"mode": mode, "server": "fifo" if parallel == 1 else f"slots{parallel}", "streams": s,
                       "requests": len(replies) * (len(got) if parallel != 1 else 1), "tokens": tokens, "wall_s": round(wall, 2),
                       "aggregate_tok_s": round(tokens / wall, 1), "per_stream_tok_s": round(per_stream, 1),
                       "rounds_tok_s": [round(sum(n for _, n, _ in r[0].values()) / r[1], 1) for r in got],
                       "rounds_tok_per_cpu_s": [round(sum(n for _, n, _ in r[0].values()) / max(r[3], 1e-9), 1) for r in got],
                       "same_as_fifo": same, "load_1min": round(load, 2),
                       "drafted": sum(r[4] for r in got), "accepted": sum(r[5] for r in got)}  # every round's, from /metrics
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(markdown(rows, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=1) + "\n")
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    return 1 if problems else 0


def requantized(args) -> tuple[str, str | None]:
    """(target requantized to ``args.quant``, the drafter to serve it with): the pair's drafter unless --drafter names one."""
    from localflash.llama.quantize import quantize
    from localflash.registry.pairs import derived_path, get_pair

    pair = None if args.model else get_pair(args.pair)
    target = Path(args.model) if args.model else pair.target
    drafter = args.drafter or (str(pair.drafter) if pair is not None and pair.drafter is not None else None)
    if drafter is not None and not Path(drafter).exists():
        raise LocalflashError(f"the drafter {drafter} is not there", hint="run the pair once (it derives its drafter) or pass --drafter")
    out = derived_path(target, args.quant.upper())
    if not out.exists():
        print(f"requantizing {target.name} to {args.quant.upper()} -> {out}", file=sys.stderr, flush=True)
        quantize(target, out, args.quant.upper())
    return str(out), drafter


def _chat(client, model: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content or "", r.usage.completion_tokens


def _run(server, n_streams: int, n_requests: int, max_tokens: int):
    """``n_streams`` clients at once, each sending ``n_requests``; {(stream, i): (text, tokens, seconds)} and the wall time."""
    out: dict = {}
    errors: list = []

    def stream(k: int):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        for i in range(n_requests):
            prompt = f"Write a short paragraph about {TOPICS[(k * n_requests + i) % len(TOPICS)]}."
            t = time.perf_counter()
            try:
                text, n = _chat(client, server.model, prompt, max_tokens)
            except Exception as e:  # noqa: BLE001 (reported)
                errors.append(e)
                return
            out[(k, i)] = (text, n, time.perf_counter() - t)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(n_streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, time.perf_counter() - t0


def markdown(rows: list[dict], args) -> str:
    lines = [f"{'model ' + Path(args.model).name if args.model else 'pair ' + args.pair}, {args.max_tokens} tokens a request, "
             f"{args.requests} requests a stream, -t {args.threads}, best of {args.rounds} interleaved rounds" + (", --exact" if args.exact else ""),
             "", "| mode | streams | FIFO agg tok/s | slots agg tok/s | slots / FIFO | slots / plain slots | same, by server CPU s "
             "| FIFO per-stream | slots per-stream | same | slots drafted / accepted | load (FIFO / slots) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    by = {(r["mode"], r["server"] == "fifo", r["streams"]): r for r in rows}
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    for r in sorted((r for r in rows if r["server"] != "fifo"), key=lambda r: (modes.index(r["mode"]), r["streams"])):
        f = by.get((r["mode"], True, r["streams"]))
        plain = by.get(("none", False, r["streams"]))
        if f is None:
            continue
        vs_plain = f"{paired(r, plain):.2f}×" if plain else "—"
        vs_plain_cpu = f"{paired(r, plain, 'rounds_tok_per_cpu_s'):.2f}×" if plain else "—"
        lines.append(f"| {r['mode']} | {r['streams']} | {f['aggregate_tok_s']} | {r['aggregate_tok_s']} | "
                     f"{paired(r, f):.2f}× | {vs_plain} | {vs_plain_cpu} | {f['per_stream_tok_s']} | {r['per_stream_tok_s']} | "
                     f"{r['same_as_fifo']}/{r['requests']} | {r['drafted']} / {r['accepted']} | {f['load_1min']} / {r['load_1min']} |")
    lines += ["", "Ratios: the median over rounds of the two servers' aggregates in the same round (the machine's drift "
              "moves both alike); aggregates: each server's best round. By server CPU s: tokens per CPU second of the "
              "server process (user + system), paired the same way. Drafted / accepted: draft tokens the slot server's "
              "/metrics counted over every round (a ratio to plain slots says what drafting cost only where it drafted)."]
    return "\n".join(lines)


def paired(row: dict, base: dict, key: str = "rounds_tok_s") -> float:
    """The median over rounds of ``row``'s aggregate over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(row[key], base[key]))


def draft_counts(server) -> tuple[int, int]:
    """The server's draft tokens and accepted draft tokens so far (/metrics)."""
    text = httpx.get(server.url + "/metrics", timeout=60).text
    got = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total"):
            got[name] = int(float(value))
    return got.get("llamacpp:spec_decode_num_draft_tokens_total", 0), got.get("llamacpp:spec_decode_num_accepted_tokens_total", 0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
