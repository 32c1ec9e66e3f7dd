#!/usr/bin/env python3
"""Real-model benchmark suite: localflash vs plain decoding vs llama.cpp's C++ speculative driver.

For each pair and prompt set (Spec-Bench's six categories, HumanEval) and each
number of new tokens, every prompt is run in every mode, the modes taking turns
(the order rotates from prompt to prompt, so slow drift of a shared machine
cancels): plain decoding, each localflash drafter with fixed draft lengths and
with the adaptive length, and ``peer/bin/llama-speculative-simple`` (built by
scripts/build_peer.sh from the same vendored llama.cpp) with the same draft
settings, greedy. Per mode: decode tok/s, ratio to plain, τ, per-position
acceptance, host overhead per cycle, peak RSS; whether the output equals plain
decoding. Writes docs/benchmarks.md and docs/benchmarks.json.

The default run fits in about 25 minutes on a shared 2-core machine: prompts
are taken category by category (round robin) until each pair's share of
``--budget-min`` is spent. Scale with --budget-min, --per-category, --lengths,
--tokens, --pairs.

    .venv/bin/python benchmarks/speed/bench_suite.py
    .venv/bin/python benchmarks/speed/bench_suite.py --pairs qwen-coder --lengths 2,4,8 --budget-min 120
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from localflash.bench import rig as bl  # noqa: E402
from localflash.bench.prompts import HUMANEVAL_COMPLETE_INSTRUCTION, BenchPrompt, humaneval, spec_bench_groups  # noqa: E402

ROOT = bl.ROOT
PEER = ROOT / "peer" / "bin" / "llama-speculative-simple"
DEFAULT_SHARES = {"demo": 0.2, "demo-draft": 0.2, "qwen-coder": 0.6}
TARGETS = {"peer": 1.0, "plain": 0.97, "host": 0.03}


# -- the C++ peer -----------------------------------------------------------------

def peer_command(target: Path, drafter: Path | None, kind: str, k: int, prompt_file: Path, n: int, ctx: int, threads: int,
                 binary: Path | None = None) -> list[str]:
    """``llama-speculative-simple`` (``binary``, default peer/bin's) greedy with a fixed draft length ``k``.

    ``kind``: draft (draft-simple, p-min 0: no draft stops early), dflash (draft-dflash, the block
    ``[last, MASK x k]``; the file's block size caps k), ngram (ngram-simple).
    """
    cmd = [str(binary or PEER), "-m", str(target), "-f", str(prompt_file), "-n", str(n), "--temp", "0", "--top-k", "1",
           "-t", str(threads), "-c", str(ctx), "--no-escape", "--seed", "1"]
    if kind in ("draft", "dflash"):
        cmd += ["-md", str(drafter), "--spec-type", "draft-simple" if kind == "draft" else "draft-dflash",
                "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(threads)]
    elif kind == "ngram":
        # llama.cpp's prompt lookup: a fixed 3-token key (ours tries 4, then 3), at most k tokens copied
        cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", str(k)]
    else:
        raise ValueError(kind)
    return cmd


_NUM = {
    "encoded": re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*(\d+)"),
}


def run_peer(cmd: list[str], prompt_text: str) -> dict:
    """Run the peer once; parse its timing and acceptance lines; peak RSS from wait4."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=os.environ.copy())
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", errors="replace")
        stderr = err.read().decode("utf-8", errors="replace")
    if p.returncode != 0:
        tail = "\n".join(stderr.splitlines()[-8:])
        raise RuntimeError(f"peer failed ({p.returncode}): {shlex.join(cmd)}\n{tail}")
    r: dict = {"rss_bytes": usage.ru_maxrss * 1024}
    for key, rx in _NUM.items():
        m = rx.search(stderr)
        if not m:
            raise RuntimeError(f"peer output lacks {key!r}: {shlex.join(cmd)}")
        r[key] = [float(x) for x in m.groups()] if len(m.groups()) > 1 else int(m[1])
    n_pred, t_dec = int(r["decoded"][0]), r["decoded"][1]
    cycles = max(1, n_pred - r["n_accept"])
    i = stdout.find(prompt_text)
    r.update(
        prompt_tokens=int(r["encoded"][0]),
        generated=n_pred,
        t_decode=t_dec,
        tok_s=n_pred / t_dec if t_dec > 0 else 0.0,
        cycles=cycles,
        tau=n_pred / cycles,
        acceptance=r["n_accept"] / r["n_drafted"] if r["n_drafted"] else 0.0,
        text=stdout[i + len(prompt_text) :] if i >= 0 else None,
    )
    return r


# -- the suite --------------------------------------------------------------------

def threads_check(model: Path, seconds: float = 6.0) -> list[dict]:
    """Plain decode tok/s of ``model`` at 1 thread, and at 2 threads with active and passive OpenMP waiting."""
    code = (
        "import sys,time,numpy as np;"
        "from localflash.llama import Model,Context,ContextOptions;"
        "m=Model(%r);c=Context(m,ContextOptions(n_ctx=512,n_threads=int(sys.argv[1])));"
        "t=m.tokenize('The quick brown fox jumps over the lazy dog. '*4);c.decode(t,0,'last');"
        "n=len(t);s=time.perf_counter();k=0\n"
        "while time.perf_counter()-s<%f:\n"
        "  x=int(np.argmax(c.logits(-1)));c.decode([x],n+k,'last');k+=1\n"
        "print(k/(time.perf_counter()-s))"
    ) % (str(model), seconds)
    out = []
    for threads, policy in ((1, "PASSIVE"), (2, "ACTIVE"), (2, "PASSIVE"), (1, "PASSIVE")):
        env = dict(os.environ, OMP_WAIT_POLICY=policy)
        load = os.getloadavg()[0]
        res = subprocess.run([sys.executable, "-c", code, str(threads)], capture_output=True, text=True, env=env, timeout=300)
        tps = float(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 and res.stdout.strip() else None
        out.append({"threads": threads, "omp_wait_policy": policy, "tok_s": tps, "loadavg": load})
        print(f"  threads {threads}, OMP_WAIT_POLICY={policy}: {tps if tps is None else round(tps, 2)} tok/s (load {load:.1f})", file=sys.stderr)
    return out


def schedule(prompts: list[BenchPrompt], tokens: list[int]) -> list[tuple[BenchPrompt, int]]:
    """Round robin over categories: round r takes prompt r of every category, at each token count."""
    cats: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        cats.setdefault(p.category, []).append(p)
    units = []
    for r in range(max(len(v) for v in cats.values())):
        for n in tokens:
            for ps in cats.values():
                if r < len(ps):
                    units.append((ps[r], n))
    return units


def run_pair(pair: str, a, budget_s: float, log) -> dict:
    from localflash.llama import Model
    from localflash.config import config_from
    from localflash.engine import ensure_drafter_file

    cfg = config_from(pair, None, None)
    kinds = [cfg.spec] + (["ngram"] if cfg.spec != "ngram" else [])
    kinds = [k for k in kinds if k != "none"]
    drafters = {k: ensure_drafter_file(cfg) for k in kinds if k in ("draft", "dflash")}
    amax = {"ngram": cfg.draft_max or 8, "draft": cfg.draft_max or 8, "dflash": min(cfg.draft_max or 15, 15)}
    specs = bl.mode_names(kinds, a.lengths, amax, adaptive=True)
    peer_modes = []
    if not a.no_peer:
        for kind in kinds:
            if kind in ("draft", "ngram"):
                peer_modes += [(f"peer-{kind}-k{k}", kind, k) for k in a.lengths]

    target = Model(cfg.target)
    prompts = spec_bench_groups(a.per_category) + humaneval(a.humaneval, HUMANEVAL_COMPLETE_INSTRUCTION)
    rendered = {p.id: bl.render(target, p.text) for p in prompts}
    n_ctx = max(1024, -(-(max(len(t) for _, t in rendered.values()) + max(a.tokens) + 64) // 256) * 256)
    bench = bl.build(cfg.target, drafters, specs, n_ctx=n_ctx, threads=a.threads, target=target)
    names = [m.name for m in bench.modes] + [m[0] for m in peer_modes]
    log(f"pair {pair}: {Path(cfg.target).name}" + "".join(f" + {k} {Path(p).name}" for k, p in drafters.items())
        + f"; modes {', '.join(names)}; budget {budget_s / 60:.1f} min")
    runs: list[dict] = []
    local_runs: dict[tuple[str, int], list[bl.Run]] = {}
    t0 = time.perf_counter()
    units = schedule(prompts, a.tokens)
    done_units = 0
    tmp = Path(tempfile.mkdtemp(prefix="lf-suite-"))
    try:
        for m in bench.modes:  # warm-up: page in, calibrate the adaptive policies
            bl.run_one(bench, m, prompts[0], rendered[prompts[0].id][1], 16)
        for u, (p, n) in enumerate(units):
            if time.perf_counter() - t0 > budget_s:
                log(f"  budget spent after {done_units}/{len(units)} prompt runs")
                break
            text, toks = rendered[p.id]
            order = [("local", m) for m in bench.modes] + [("peer", m) for m in peer_modes]
            r = u % len(order)
            order = order[r:] + order[:r]
            pf = tmp / f"{p.id.replace('/', '_')}.txt"
            pf.write_text(text + "\n", encoding="utf-8")  # the peer's -f drops one trailing newline
            row = {}
            for who, m in order:
                if who == "local":
                    run = bl.run_one(bench, m, p, toks, n)
                    local_runs.setdefault((m.name, n), []).append(run)
                    runs.append({"pair": pair, "mode": m.name, "kind": m.kind, "k": m.k, "adaptive": m.adaptive, "tokens": n,
                                 "prompt": p.id, "category": p.category, "prompt_tokens": len(toks), "generated": run.generated,
                                 "tok_s": run.tok_s, "t_decode": run.t_decode, "t_target": run.t_target, "t_draft": run.t_draft,
                                 "t_host": run.t_host, "cpu_decode": run.cpu_decode, "cpu_host": run.cpu_host,
                                 "cycles": run.stats["cycles"], "drafted": run.stats["drafted"],
                                 "accepted": run.stats["accepted"], "committed": run.stats["committed"],
                                 "pos_tries": run.stats["pos_tries"], "pos_hits": run.stats["pos_hits"],
                                 "accept_hist": run.stats["accept_hist"], "output": run.tokens})
                    row[m.name] = run.tok_s
                else:
                    name, kind, k = m
                    res = run_peer(peer_command(cfg.target, drafters.get(kind), kind, k, pf, n, n_ctx, a.threads), text)
                    runs.append({"pair": pair, "mode": name, "kind": kind, "k": k, "adaptive": False, "tokens": n, "prompt": p.id,
                                 "category": p.category, "prompt_tokens": res["prompt_tokens"], "generated": res["generated"],
                                 "tok_s": res["tok_s"], "t_decode": res["t_decode"], "cycles": res["cycles"],
                                 "drafted": res["n_drafted"], "accepted": res["n_accept"], "rss_bytes": res["rss_bytes"],
                                 "peer_text": res["text"], "prompt_tokens_ours": len(toks)})
                    row[name] = res["tok_s"]
            done_units += 1
            log(f"  [{done_units}] {p.category:<14} {n:4d} tok | " + " ".join(f"{k}={v:.1f}" for k, v in row.items())
                + f" | load {os.getloadavg()[0]:.1f} | {(time.perf_counter() - t0) / 60:.1f} min")
    finally:
        bench.close()
    # same-as-plain for the peer: its text must start with plain decoding's text
    plain_text = {(r["prompt"], r["tokens"]): target.detokenize(r["output"]).rstrip("\ufffd") for r in runs if r["mode"] == "plain"}
    for r in runs:
        if r["mode"].startswith("peer-"):
            want = plain_text.get((r["prompt"], r["tokens"]))
            r["same_as_plain"] = bool(want is not None and r.get("peer_text") is not None and r["peer_text"].startswith(want))
    plain_out = {(r["prompt"], r["tokens"]): r["output"] for r in runs if r["mode"] == "plain"}
    for r in runs:
        if "output" in r:
            r["same_as_plain"] = r["output"] == plain_out.get((r["prompt"], r["tokens"]))
    return {"pair": pair, "target": str(cfg.target), "drafters": {k: str(v) for k, v in drafters.items()},
            "modes": names, "runs": runs, "units": done_units, "minutes": (time.perf_counter() - t0) / 60,
            "summary": summarize_pair(runs, names, a.tokens)}


def summarize_pair(runs: list[dict], names: list[str], tokens: list[int]) -> dict:
    """Per token count, per category (and 'all'), per mode: totals over the prompts every mode ran."""
    out: dict = {}
    for n in tokens:
        rs = [r for r in runs if r["tokens"] == n]
        if not rs:
            continue
        cats = list(dict.fromkeys(r["category"] for r in rs))
        out[str(n)] = {}
        for scope in cats + ["all"]:
            sel = [r for r in rs if scope == "all" or r["category"] == scope]
            table = {}
            for name in names:
                mr = [r for r in sel if r["mode"] == name]
                if not mr:
                    continue
                toks = sum(r["generated"] - (0 if name.startswith("peer-") else 1) for r in mr)
                secs = sum(r["t_decode"] for r in mr)
                cycles = sum(r["cycles"] for r in mr)
                drafted = sum(r["drafted"] for r in mr)
                accepted = sum(r["accepted"] for r in mr)
                row = {"prompts": len(mr), "tok_s": toks / secs if secs else 0.0, "seconds": secs, "cycles": cycles,
                       "acceptance": accepted / drafted if drafted else 0.0,
                       "same_as_plain": sum(bool(r.get("same_as_plain")) for r in mr)}
                if name.startswith("peer-"):
                    row["tau"] = toks / cycles if cycles else 0.0
                    row["rss_bytes"] = max(r["rss_bytes"] for r in mr)
                else:
                    committed = sum(r["committed"] for r in mr)
                    row["tau"] = committed / cycles if cycles else 0.0
                    tries, hits = [], []
                    for r in mr:
                        for arr, src in ((tries, r["pos_tries"]), (hits, r["pos_hits"])):
                            for i, v in enumerate(src):
                                while len(arr) <= i:
                                    arr.append(0)
                                arr[i] += v
                    row["position_acceptance"] = [h / t if t else 0.0 for h, t in zip(hits + [0] * len(tries), tries)]
                    th = sum(r["t_host"] for r in mr)
                    cpu, ch = sum(r["cpu_decode"] for r in mr), sum(r["cpu_host"] for r in mr)
                    row.update(host_cpu_ms_per_cycle=1000 * ch / cycles if cycles else 0.0, host_cpu_share=ch / cpu if cpu else 0.0)
                    row.update(host_ms_per_cycle=1000 * th / cycles if cycles else 0.0, host_share=th / secs if secs else 0.0,
                               target_share=sum(r["t_target"] for r in mr) / secs if secs else 0.0,
                               draft_share=sum(r["t_draft"] for r in mr) / secs if secs else 0.0)
                table[name] = row
            plain = table.get("plain", {}).get("tok_s")
            for row in table.values():
                row["x_plain"] = row["tok_s"] / plain if plain else None
            out[str(n)][scope] = table
    return out


# -- the report ---------------------------------------------------------------------

def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def write_markdown(report: dict, path: Path) -> None:
    L: list[str] = []
    m = report["machine"]
    L += ["# Benchmarks: localflash vs plain decoding vs llama.cpp's C++ speculative driver", ""]
    L += [f"Generated by `benchmarks/speed/bench_suite.py` on {report['date']} — every figure below comes from that run "
          f"(`docs/benchmarks.json` holds each prompt's numbers and outputs). Regenerate with:", "",
          "```", *report["commands"], "```", ""]
    L += ["## Machine and versions", "",
          f"- CPU: {m['cpu']}, {m['cores']} cores visible, {m['mem_gib']} GiB RAM; {m['os']}",
          f"- Python {m['python']}, llama-cpp-python {m['llama_cpp_python']} (built with `scripts/cmake_flags.sh`), numpy {m['numpy']}",
          f"- localflash commit {m.get('localflash_commit', '?')}{' + uncommitted changes' if m.get('localflash_dirty') else ''}",
          "- C++ peer: `peer/bin/llama-speculative-simple` from `scripts/build_peer.sh`: "
          + "; ".join(report.get("peer_build", "not built").splitlines()),
          f"- Threads: {report['settings']['threads']} per process (target and drafter), `OMP_WAIT_POLICY={report['settings']['omp_wait']}`, "
          "greedy, flash attention auto (on) for both, same context size for both.",
          f"- Load while running: load average {report['load_start']['loadavg'][0]:.1f} at the start, "
          f"{report['load_end']['loadavg'][0]:.1f} at the end (this 2-core machine is shared with other engineers' jobs; "
          "`top` snapshots are in the JSON).", ""]
    tc = report.get("threads_check")
    if tc:
        L += ["### Threads on a shared 2-core machine", "",
              "Plain decoding of SmolLM2-135M Q4_1 with localflash's runtime, 6 s each, in this order:", "",
              "| threads | OMP_WAIT_POLICY | tok/s | load average |", "|---|---|---|---|"]
        for t in tc:
            tps = "failed" if t["tok_s"] is None else f"{t['tok_s']:.1f}"
            L.append(f"| {t['threads']} | {t['omp_wait_policy']} | {tps} | {t['loadavg']:.1f} |")
        L += ["", "ggml's CPU backend meets its threads at an OpenMP barrier several times per layer. With the default "
              "(active) waiting a thread spins while the one it waits for is off the CPU, so when other processes hold "
              "the cores a 2-thread decode collapses; passive waiting avoids the collapse, one thread avoids the barrier. "
              "This suite therefore runs every mode, ours and the peer's, with the thread count above.", ""]
    L += ["## How to read the tables", "",
          "- **tok/s**: decode phase only (prompt processing excluded), tokens after the first divided by the decode "
          "time; the peer's figure is its own `decoded N tokens in T seconds` line, which counts the same way.",
          "- **× plain**: against localflash's plain decoding on the same prompts in the same run.",
          "- **τ**: tokens committed per target forward pass (bonus token included); **accept**: accepted / drafted.",
          "- **per-position acceptance**: share of cycles that accepted draft position j given they reached it.",
          "- **host**: decode time spent outside `llama_decode` (sampling, the Python loop, ctypes) per cycle and as a "
          "share of the cycle; target/draft shares are the time inside `llama_decode` on each context. *Wall* figures "
          "include the moments other processes held the core; *CPU* figures count this thread's CPU time only "
          "(with one llama.cpp thread the forward pass runs on it too), which is what a machine of one's own would "
          "see. The ≤ 3% aim is judged on the CPU share.",
          "- **same**: prompts whose output equals plain decoding's token for token (the peer: its text starts with "
          "plain decoding's text).",
          "- Modes: `plain`; `KIND-kN` = fixed draft length N; `KIND-adaptive` = cost-model length (up to the pair's "
          "`draft_max`); `peer-KIND-kN` = `llama-speculative-simple` with `--spec-draft-n-max N` (draft-simple, "
          "`--spec-draft-p-min 0`) or `--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m N`.", ""]
    shortfalls: list[str] = []
    for pr in report["pairs"]:
        L += [f"## Pair `{pr['pair']}`", "",
              f"Target `{Path(pr['target']).name}`" + "".join(f", {k} drafter `{Path(v).name}`" for k, v in pr["drafters"].items())
              + f". {pr['units']} prompt runs in {pr['minutes']:.1f} min.", ""]
        for n, scopes in pr["summary"].items():
            allr = scopes["all"]
            L += [f"### {n} new tokens — all prompts", "",
                  "| mode | prompts | tok/s | × plain | τ | accept | per-position acceptance | target / draft / host (wall) | host ms/cycle (wall) | host CPU ms/cycle | host CPU share | same |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for name, r in allr.items():
                if "host_share" in r:
                    split = f"{100 * r['target_share']:.0f}% / {100 * r['draft_share']:.0f}% / {100 * r['host_share']:.2f}%"
                    host = f"{r['host_ms_per_cycle']:.3f} | {r.get('host_cpu_ms_per_cycle', float('nan')):.3f} | {100 * r.get('host_cpu_share', float('nan')):.2f}%"
                else:
                    split, host = "–", "– | – | –"
                pos = bl.fmt_pos(r["position_acceptance"], 6) if r.get("position_acceptance") else "–"
                acc = "–" if name == "plain" else _pct(r["acceptance"])
                L.append(f"| {name} | {r['prompts']} | {r['tok_s']:.2f} | {r['x_plain']:.3f} | {r['tau']:.2f} | {acc} | {pos} | "
                         f"{split} | {host} | {r['same_as_plain']}/{r['prompts']} |")
            cats = [c for c in scopes if c != "all"]
            if len(cats) > 1:
                names = list(allr)
                L += ["", "Per category, tok/s (× plain):", "", "| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
                for c in cats:
                    cells = []
                    for name in names:
                        r = scopes[c].get(name)
                        cells.append("–" if r is None else f"{r['tok_s']:.1f} ({r['x_plain']:.2f})")
                    L.append(f"| {c} | " + " | ".join(cells) + " |")
            rss = [r["rss_bytes"] for r in allr.values() if "rss_bytes" in r]
            L += ["", f"Peak RSS: localflash (whole suite process, all pairs loaded so far) {report['rss_local'] / 2**20:.0f} MiB; "
                  + (f"peer (largest single run) {max(rss) / 2**20:.0f} MiB." if rss else "peer not run."), ""]
            for name, r in allr.items():
                if name.endswith("-adaptive") and r["x_plain"] is not None and r["x_plain"] < TARGETS["plain"]:
                    shortfalls.append(f"`{pr['pair']}` {n} tok: `{name}` runs at {r['x_plain']:.3f}× plain (aim ≥ 0.97×).")
                if "host_cpu_share" in r and r["host_cpu_share"] > TARGETS["host"]:
                    shortfalls.append(f"`{pr['pair']}` {n} tok: `{name}` host overhead {100 * r['host_cpu_share']:.2f}% of the cycle's CPU time "
                                      f"(wall clock: {100 * r['host_share']:.2f}%; aim ≤ 3%).")
                peer = allr.get(f"peer-{name}")
                if peer and peer["tok_s"] > r["tok_s"] * TARGETS["peer"]:
                    shortfalls.append(f"`{pr['pair']}` {n} tok: `{name}` {r['tok_s']:.2f} tok/s < peer {peer['tok_s']:.2f} tok/s "
                                      f"({r['tok_s'] / peer['tok_s']:.3f}×; aim ≥ 1×).")
    L += ["## Against the project's aims", "",
          "Aims (reported, not asserted): localflash speculative tok/s ≥ the C++ peer's on the same pair and draft "
          "length; every adaptive mode ≥ 0.97× plain decoding; host overhead ≤ 3% of the cycle.", ""]
    if shortfalls:
        L += ["Where this run falls short:", ""] + [f"- {s}" for s in shortfalls] + [""]
    else:
        L += ["This run meets all three aims.", ""]
    L += report.get("notes", [])
    path.write_text("\n".join(L) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="demo,demo-draft,qwen-coder", help="models.toml pairs (default demo,demo-draft,qwen-coder)")
    ap.add_argument("--per-category", type=int, default=3, help="Spec-Bench prompts per category at most (default 3)")
    ap.add_argument("--humaneval", type=int, default=3, help="HumanEval prompts at most (default 3)")
    ap.add_argument("--tokens", default="128,256", help="new tokens per prompt (default 128,256)")
    ap.add_argument("--lengths", default="4", help="fixed draft lengths, ours and the peer's (default 4)")
    ap.add_argument("--budget-min", type=float, default=25.0, help="minutes for the whole suite (default 25)")
    ap.add_argument("--threads", type=int, default=1, help="threads per process (default 1; see the doc)")
    ap.add_argument("--omp-wait", choices=("passive", "active", "default"), default="passive")
    ap.add_argument("--no-peer", action="store_true", help="skip the C++ peer")
    ap.add_argument("--no-threads-check", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="writes OUT.md and OUT.json")
    ap.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json and OUT.notes.md (no runs)")
    a = ap.parse_args(argv)
    if a.render:
        out = Path(a.out)
        report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
        notes = out.with_name(out.name + ".notes.md")
        report["notes"] = notes.read_text(encoding="utf-8").splitlines() if notes.exists() else []
        write_markdown(report, out.with_suffix(".md"))
        print(f"wrote {out.with_suffix('.md')}", file=sys.stderr)
        return 0
    a.tokens = [int(x) for x in a.tokens.split(",")]
    a.lengths = [int(x) for x in a.lengths.split(",")]
    bl.set_omp_wait(a.omp_wait)
    pairs = [p.strip() for p in a.pairs.split(",") if p.strip()]
    if not a.no_peer and not PEER.exists():
        print(f"error: {PEER} not found: run scripts/build_peer.sh (or pass --no-peer)", file=sys.stderr)
        return 1

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": bl.machine_info(),
              "load_start": bl.load_snapshot(),
              "settings": {"threads": a.threads, "omp_wait": os.environ.get("OMP_WAIT_POLICY", "default"), "tokens": a.tokens,
                           "lengths": a.lengths, "per_category": a.per_category, "humaneval": a.humaneval,
                           "budget_min": a.budget_min, "pairs": pairs},
              "commands": ["scripts/get_bench_models.sh", "scripts/build_peer.sh",
                           ".venv/bin/python benchmarks/speed/bench_suite.py " + shlex.join(sys.argv[1:] if argv is None else argv)]}
    if (ROOT / "peer" / "BUILD_INFO").exists():
        report["peer_build"] = (ROOT / "peer" / "BUILD_INFO").read_text()
    if not a.no_threads_check:
        from localflash.config import config_from

        log("threads check (SmolLM2 plain decode)")
        report["threads_check"] = threads_check(config_from("demo", None, None).target)
    shares = {p: DEFAULT_SHARES.get(p, 1.0) for p in pairs}
    report["pairs"] = []
    for i, pair in enumerate(pairs):
        left = a.budget_min * 60 - (time.perf_counter() - t_start)
        rest = sum(shares[p] for p in pairs[i:])
        budget = max(60.0, left * shares[pair] / rest) if rest else left
        report["pairs"].append(run_pair(pair, a, budget, log))
    report["rss_local"] = bl.peak_rss_bytes()
    report["load_end"] = bl.load_snapshot()
    report["minutes"] = (time.perf_counter() - t_start) / 60
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    notes = out.with_name(out.name + ".notes.md")
    if notes.exists():
        report["notes"] = notes.read_text(encoding="utf-8").splitlines()
    out.with_suffix(".json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    write_markdown(report, out.with_suffix(".md"))
    log(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')} ({report['minutes']:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
