"""`localflash serve` against llama.cpp's `llama-server` on the same files, the same machine and the same requests.

For each mode (``none`` = plain decoding, then each drafter kind both servers run: ``draft`` = a
small draft model, ``ngram`` = prompt lookup, ``dflash`` where the pair's drafter is a DFlash file)
both servers are started, with the same target, context, slots (``-np`` / ``--parallel``) and
threads; every mode's servers stay up together for the whole run. For each client count C (1, 2,
4, 8) C real `openai` clients send REQUESTS streamed chat requests each, greedy, all at once, to
one server after another, every server once a round, ROUNDS rounds, each round starting one server
later and every other round backwards (interleaved: a machine's drift hits all of them alike, so a
drafting row is compared with the plain rows of the same rounds). Prompts (``--prompts long``, the
default) ask for essays that run past --max-tokens, so every reply on both servers is that long and
aggregate tok/s is not skewed by replies that end early on one server (``short``: paragraphs, as
before; then llama-server also counts the end-of-generation token in ``completion_tokens``, which
localflash does not). Reported per server: aggregate tok/s (completion tokens of all C streams / wall time),
per-stream tok/s (a request's completion tokens / its latency as the client sees it), TTFT (the
first content chunk), each the median over rounds; the ratio localflash / llama-server is the
median over rounds of the two aggregates of the same round, with the range of those per-round ratios
beside it (on a shared VM one server's own rounds spread by ±10%: a median inside that range is no
ranking). Before the rounds of each client count every server serves that many clients once, unmeasured
(WARMUP_TOKENS each). ``equal`` counts replies whose text
is the same on both servers (same prompt, same round); a drafting mode's row also gives localflash
over the better of llama-server's plain and drafting aggregates of the same round (``lf / best ls``)
and over localflash's own plain (``lf / lf plain``), when ``none`` is among the modes. The 1-minute load average is recorded
beside every row: timings need an idle machine. So is each server's CPU a generated token (Linux /proc, all
its threads), and the part of it outside its ``--threads`` busiest threads (the decode): the HTTP side, request
handling and hand-offs, which on a machine whose cores all decode take their time from the decode. And
the slots each batched decode carried, on average (both servers' ``/metrics``: llama-server's
``n_busy_slots_per_decode``, which localflash exports too; llama-server needs ``--metrics``): a server
whose requests join late decodes more, smaller batches for the same tokens.

Drafting flags: localflash ``--spec draft --draft-max N`` (its adaptive length, unless --fixed)
against ``--spec-type draft-simple --spec-draft-n-max N``; ``--spec ngram`` against
``--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m N`` (a 3-token
key, as localflash's shortest); ``--spec dflash`` against ``--spec-type draft-dflash``.

llama-server comes from ``--peer`` (default ``peer/bin/llama-server``); when it is missing it is built
with ``TARGETS="llama-speculative-simple llama-server" scripts/build_peer.sh`` (10-20 minutes).

    .venv/bin/python benchmarks/serve/bench_vs_llama_server.py --model target.gguf --draft-model draft.gguf \\
        --modes none,draft,ngram --slots 4 --ctx 8192 --threads 2 --max-tokens 96 --json vs_llama_server.json
    .venv/bin/python benchmarks/serve/bench_vs_llama_server.py --pair demo --modes none,ngram,dflash --clients 1,2 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

from localflash.testing.serve import LiveServer

ROOT = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WARMUP_TOKENS = 24  # each server, before the rounds of each client count: that many clients, this many tokens each
TOPICS = ["the sea", "a mountain", "bread", "a library", "rain", "a city at night", "bicycles", "tea",
          "a lighthouse", "winter", "a market", "trains", "an old clock", "the moon", "gardens", "a river"]


class LlamaServer:
    """``llama-server ARGS`` on a free loopback port: waits for /health (the model loaded)."""

    def __init__(self, binary: Path, args: list[str], log: Path, timeout: float = 600):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = log
        self.out = open(log, "w")
        self.proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port), *args], stdout=self.out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server did not start:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.model = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.out.close()


def peer_binary(path: str | None) -> Path:
    """llama-server: ``path``, or peer/bin/llama-server, built by scripts/build_peer.sh when missing."""
    binary = Path(path) if path else ROOT / "peer" / "bin" / "llama-server"
    if not binary.exists():
        if path:
            raise SystemExit(f"no llama-server at {binary}")
        print("building llama-server with scripts/build_peer.sh (10-20 minutes)", file=sys.stderr, flush=True)
        env = dict(os.environ, TARGETS="llama-speculative-simple llama-server")
        subprocess.run(["bash", str(ROOT / "scripts" / "build_peer.sh")], check=True, env=env)
    return binary


def files(args) -> tuple[str, str | None, str | None]:
    """(target, the pair's DFlash drafter or None, a draft model or None)."""
    if args.model:
        return args.model, args.dflash, args.draft_model
    from localflash.registry.pairs import get_pair

    pair = get_pair(args.pair)
    drafter = str(pair.drafter) if pair.drafter is not None else None
    return str(pair.target), drafter if pair.kind == "dflash" else args.dflash, args.draft_model or (drafter if pair.kind == "draft" else None)


def server_args(mode: str, args, target: str, dflash: str | None, draft: str | None) -> tuple[list[str], list[str]]:
    """(localflash serve arguments, llama-server arguments) of one mode."""
    n = str(args.draft_max)
    common_lf = ["-m", target, "-t", str(args.threads), "-c", str(args.ctx), "--parallel", str(args.slots), "--queue", "64"]
    common_ls = ["-m", target, "-t", str(args.threads), "-c", str(args.ctx), "-np", str(args.slots), "--metrics"]
    fixed = ["--fixed"] if args.fixed else []
    if mode == "none":
        return common_lf + ["--spec", "none"], common_ls
    if mode == "draft":
        if not draft:
            raise SystemExit("mode draft needs a draft model: --draft-model FILE (or a pair whose drafter is one)")
        return (common_lf + ["--spec", "draft", "--drafter", draft, "--draft-max", n] + fixed,
                common_ls + ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", n])
    if mode == "ngram":
        return (common_lf + ["--spec", "ngram", "--draft-max", n] + fixed,
                common_ls + ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", n])
    if mode == "dflash":
        if not dflash:
            raise SystemExit("mode dflash needs a DFlash drafter: --dflash FILE (or a pair whose drafter is one)")
        return (common_lf + ["--spec", "dflash", "--drafter", dflash] + fixed,
                common_ls + ["-md", dflash, "--spec-type", "draft-dflash"])
    raise SystemExit(f"unknown mode {mode!r}: none, draft, ngram or dflash")


def one_request(client, model: str, prompt: str, max_tokens: int) -> tuple[str, int, float, float]:
    """A streamed greedy chat request: (text, completion tokens, seconds to the first content, seconds in all)."""
    t0 = time.perf_counter()
    ttft, parts, usage = None, [], None
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
                                            max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                parts.append(choice.delta.content)
    total = time.perf_counter() - t0
    return "".join(parts), usage if usage is not None else len(parts), ttft if ttft is not None else total, total


def prompt_text(c: int, i: int, n_requests: int, style: str = "short") -> str:
    topic = TOPICS[(c * n_requests + i) % len(TOPICS)]
    if style == "long":
        return f"Write a long, detailed essay of at least 600 words about {topic}."
    return f"Write a short paragraph about {topic}."


def run_clients(url: str, model: str, n_clients: int, n_requests: int, max_tokens: int, style: str = "short") -> tuple[dict, float]:
    """``n_clients`` clients at once, each sending ``n_requests``; {(client, i): (text, tokens, ttft, seconds)} and the wall time."""
    out: dict = {}
    errors: list = []

    def client_loop(c: int):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
        for i in range(n_requests):
            prompt = prompt_text(c, i, n_requests, style)
            try:
                out[(c, i)] = one_request(client, model, prompt, max_tokens)
            except Exception as e:  # noqa: BLE001 (reported)
                errors.append(e)
                return

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, time.perf_counter() - t0


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of process ``pid`` so far, by thread id (Linux /proc)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def cpu_split(before: dict, after: dict, n_threads: int) -> dict:
    """A run's CPU seconds: its ``n_threads`` busiest threads (the decode: llama.cpp's threads, the calling one
    with its Python between decodes) and all other threads (HTTP, request handling, hand-offs)."""
    used = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    return {"decode": sum(used[:n_threads]), "other": sum(used[n_threads:])}


def decode_counts(url: str) -> tuple[float, float]:
    """(batched decodes so far, busy slots summed over them) from a server's /metrics (both servers export
    llama-server's ``n_decode_total`` and ``n_busy_slots_per_decode``, the latter a mean since start)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    got = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode"):
            got[name] = float(value)
    n = got.get("llamacpp:n_decode_total", 0.0)
    return n, n * got.get("llamacpp:n_busy_slots_per_decode", 0.0)


def cpu_per_token(cpu: dict, replies: dict) -> dict:
    """CPU ms a generated token (all threads, and outside the decode threads); the run's batched decodes a
    generated token and busy slots a decode (prompt chunks included) where the server counts them."""
    tokens = max(1, sum(n for _, n, _, _ in replies.values()))
    out = {"cpu_ms_per_token": 1000 * (cpu["decode"] + cpu["other"]) / tokens, "other_threads_ms_per_token": 1000 * cpu["other"] / tokens}
    if cpu.get("decodes"):
        out["decodes_per_token"] = cpu["decodes"] / tokens
        out["slots_per_decode"] = cpu["busy_slots"] / cpu["decodes"]
    return out


def figures(replies: dict, wall: float) -> dict:
    tokens = sum(n for _, n, _, _ in replies.values())
    return {"tokens": tokens, "aggregate_tok_s": tokens / wall,
            "per_stream_tok_s": statistics.mean(n / t for _, n, _, t in replies.values() if t > 0),
            "ttft_s": statistics.median(f for _, _, f, _ in replies.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--model", default=None, help="a target file instead of the pair's")
    ap.add_argument("--draft-model", default=None, help="a small model of the target's family, for mode draft")
    ap.add_argument("--dflash", default=None, help="a DFlash drafter, for mode dflash (a pair's DFlash drafter by default)")
    ap.add_argument("--modes", default="none,draft,ngram")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=1, help="requests each client sends, one after the other")
    ap.add_argument("--slots", type=int, default=4, help="-np / --parallel of both servers")
    ap.add_argument("--ctx", "-c", type=int, default=8192)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--fixed", action="store_true", help="localflash drafts a fixed length (as llama-server does), not its adaptive one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", choices=["long", "short"], default="long",
                    help="long: essays that run to --max-tokens (every reply the same length on both servers); "
                         "short: a paragraph, replies end by end-of-generation at lengths that differ")
    ap.add_argument("--peer", default=None, help="the llama-server binary (default peer/bin/llama-server, built when missing)")
    ap.add_argument("--lf-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the localflash server (repeatable; e.g. GOMP_SPINCOUNT=300000, libgomp's default spin)")
    ap.add_argument("--lf-arg", action="append", default=[], metavar="ARG",
                    help="one more localflash serve argument (repeatable; e.g. --lf-arg=--kv-pool --lf-arg=split)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    binary = peer_binary(args.peer)
    target, dflash, draft = files(args)
    clients = [int(c) for c in args.clients.split(",")]
    modes = args.modes.split(",")
    work = Path(tempfile.mkdtemp(prefix="lf-vs-ls-"))
    rows = []
    servers: dict[tuple[str, str], object] = {}
    try:  # every mode's two servers up at once (an idle server waits without CPU): one round visits all of them
        lf_env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.lf_env)) if args.lf_env else None
        for mode in modes:
            lf_args, ls_args = server_args(mode, args, target, dflash, draft)
            servers[mode, "localflash"] = LiveServer(*lf_args, *args.lf_arg, log=work / f"localflash-{mode}.log", env=lf_env)
            servers[mode, "llama-server"] = LlamaServer(binary, ls_args, work / f"llama-server-{mode}.log")
        for s in servers.values():  # warm-up (localflash: the step policy's calibration)
            run_clients(s.url, s.model, 1, 1, 8, args.prompts)
        keys = list(servers)
        for n in clients:
            for key in keys:  # each server warmed at this client count (unmeasured): its first batch of n is not a round's
                run_clients(servers[key].url, servers[key].model, n, 1, WARMUP_TOKENS, args.prompts)
            got: dict[tuple[str, str], list] = {key: [] for key in keys}
            for r in range(args.rounds):
                order = keys[r % len(keys):] + keys[: r % len(keys)]  # each round starts one server later,
                order = order if r % 2 == 0 else order[::-1]  # and every other round runs backwards
                for key in order:
                    load = os.getloadavg()[0]
                    counts, before = decode_counts(servers[key].url), thread_cpu(servers[key].proc.pid)
                    replies, wall = run_clients(servers[key].url, servers[key].model, n, args.requests, args.max_tokens, args.prompts)
                    cpu = cpu_split(before, thread_cpu(servers[key].proc.pid), args.threads)
                    after = decode_counts(servers[key].url)
                    cpu["decodes"], cpu["busy_slots"] = after[0] - counts[0], after[1] - counts[1]
                    got[key].append((replies, wall, load, cpu))
            for mode in modes:
                row = mode_row(mode, n, args, got)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    print(markdown(rows, args, target))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "target": target, "rows": rows}, indent=1) + "\n")
    return 0


def mode_row(mode: str, n: int, args, got: dict) -> dict:
    """One mode's row at ``n`` clients: each server's medians over rounds, the ratio, and for a drafting mode
    (when plain ran too) localflash over the better of llama-server's plain and drafting, and over its own plain,
    each the median over rounds of the same round's aggregates."""
    lf, ls = got[mode, "localflash"], got[mode, "llama-server"]
    equal = sum(a[0] == b[0] for (ra, *_), (rb, *_) in zip(lf, ls) for a, b in ((ra[key], rb[key]) for key in ra))
    row = {"mode": mode, "clients": n, "rounds": args.rounds, "requests": n * args.requests * args.rounds, "equal_texts": equal}
    agg = {}
    for key, runs in got.items():
        if key[0] != mode and not (key[0] == "none" and mode != "none"):
            continue
        fs = [figures(replies, wall) | cpu_per_token(cpu, replies) for replies, wall, _, cpu in runs]
        agg[key] = [f["aggregate_tok_s"] for f in fs]
        if key[0] != mode:
            continue
        name = key[1]
        row[name] = {k: round(statistics.median(f[k] for f in fs), 3) for k in fs[0]}
        row[name]["rounds_aggregate_tok_s"] = [round(a, 2) for a in agg[key]]
        row[name]["load_1min"] = [round(load, 2) for _, _, load, _ in runs]

    def over(a, b):
        return round(statistics.median(x / y for x, y in zip(a, b)), 3)

    row["localflash_over_llama_server"] = over(agg[mode, "localflash"], agg[mode, "llama-server"])
    row["rounds_ratio"] = [round(x / y, 3) for x, y in zip(agg[mode, "localflash"], agg[mode, "llama-server"])]
    if mode != "none" and ("none", "llama-server") in agg:
        best = [max(p, d) for p, d in zip(agg["none", "llama-server"], agg[mode, "llama-server"])]
        row["localflash_over_best_llama_server"] = over(agg[mode, "localflash"], best)
        row["localflash_over_own_plain"] = over(agg[mode, "localflash"], agg["none", "localflash"])
    return row


def markdown(rows: list[dict], args, target: str) -> str:
    lines = [f"{Path(target).name}, -np {args.slots} -c {args.ctx} -t {args.threads}, {args.max_tokens} tokens a request "
             f"({args.prompts} prompts), greedy, medians of {args.rounds} interleaved rounds (every server in each round)", "",
             "| mode | clients | localflash agg tok/s | llama-server agg tok/s | ratio (rounds' range) | lf / best ls | lf / lf plain "
             "| per-stream (lf / ls) | TTFT s (lf / ls) | CPU ms a token (lf / ls) | of it outside the decode threads "
             "| slots a decode (lf / ls) | equal texts | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lf, ls = r["localflash"], r["llama-server"]
        best = f"{r['localflash_over_best_llama_server']:.2f}×" if "localflash_over_best_llama_server" in r else "–"
        own = f"{r['localflash_over_own_plain']:.2f}×" if "localflash_over_own_plain" in r else "–"
        lines.append(f"| {r['mode']} | {r['clients']} | {lf['aggregate_tok_s']:.1f} | {ls['aggregate_tok_s']:.1f} | "
                     f"{r['localflash_over_llama_server']:.2f}× ({_span(r)}) | {best} | {own} | {lf['per_stream_tok_s']:.1f} / {ls['per_stream_tok_s']:.1f} | "
                     f"{lf['ttft_s']:.2f} / {ls['ttft_s']:.2f} | {lf['cpu_ms_per_token']:.1f} / {ls['cpu_ms_per_token']:.1f} | "
                     f"{lf['other_threads_ms_per_token']:.2f} / {ls['other_threads_ms_per_token']:.2f} | "
                     f"{_slots(lf)} / {_slots(ls)} | {r['equal_texts']}/{r['requests']} | "
                     f"{max(lf['load_1min'] + ls['load_1min']):.2f} |")
    return "\n".join(lines)


def _slots(fig: dict) -> str:
    return f"{fig['slots_per_decode']:.2f}" if "slots_per_decode" in fig else "–"


def _span(row: dict) -> str:
    ratios = row.get("rounds_ratio") or [row["localflash_over_llama_server"]]
    return f"{min(ratios):.2f}–{max(ratios):.2f}"


if __name__ == "__main__":
    sys.exit(main())
