"""A real model calling tools: the share of replies with a parsable call to the right function and schema-valid arguments.

Rows: the first 50 of BFCL v4 "simple (Python)" (benchmarks/serve/data, Apache-2.0; one
function per row, the user asks for a call of it). Each row goes to ``localflash serve``
through the real ``openai`` client with the function as the only tool, greedy, for
``tool_choice`` auto, required and named, with drafting on (the pair's drafter) and off
(``speculative.n_max`` 0). A reply counts when it has a tool call whose name is the row's
function and whose arguments are valid for its schema (required ones there, no unknown
ones, types and enums right). Greedy replies with and without drafting must be equal.

    python benchmarks/serve/bench_tool_calls.py --pair qwen-coder --out /tmp/tool_calls.json

Rows go in data order, each row through every choice with drafting on then off, so a run cut
short holds whole rows. The report is rewritten after every reply; rerun with the same
``--out`` to go on where it stopped (rows there are skipped), and ``--merge`` takes rows from
an earlier report. Each reply names its run (``runs``: commit, command, load, times).

BFCL writes ``dict``/``float``/``tuple`` types and dotted names; they become ``object``,
``number``, ``array`` and ``_`` (as BFCL's own OpenAI handler does).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import openai

from localflash.testing.serve import LiveServer

DATA = Path(__file__).parent / "data" / "bfcl_v4_simple_python_50.jsonl"
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def openai_schema(s):
    if isinstance(s, dict):
        out = {}
        for k, v in s.items():
            if k == "type" and isinstance(v, str):
                t = TYPES.get(v, v)
                if t is not None:
                    out[k] = t
            elif k in ("properties",):
                out[k] = {pk: openai_schema(pv) for pk, pv in v.items()}
            else:
                out[k] = openai_schema(v)
        return out
    if isinstance(s, list):
        return [openai_schema(x) for x in s]
    return s


def tool_of(fn: dict) -> dict:
    return {"type": "function", "function": {"name": fn["name"].replace(".", "_"), "description": fn.get("description", ""),
                                             "parameters": openai_schema(fn["parameters"])}}


def valid(value, schema: dict) -> bool:
    t = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list) and all(valid(v, schema.get("items") or {}) for v in value)
    if t == "object":
        return isinstance(value, dict) and args_valid(value, schema) if "properties" in schema else isinstance(value, dict)
    return True


def args_valid(args: dict, schema: dict) -> bool:
    props = schema.get("properties", {})
    if any(k not in args for k in schema.get("required", [])) or any(k not in props for k in args):
        return False
    return all(valid(v, props[k]) for k, v in args.items())


def one(client, model, row, choice, drafting: bool, max_tokens: int) -> dict:
    tool = tool_of(row["function"][0])
    name = tool["function"]["name"]
    kw = dict(model=model, messages=row["question"][0], tools=[tool], temperature=0, max_tokens=max_tokens)
    if choice == "named":
        kw["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif choice is not None:
        kw["tool_choice"] = choice
    if not drafting:
        kw["extra_body"] = {"speculative.n_max": 0}
    t0 = time.perf_counter()
    try:
        r = client.chat.completions.create(**kw)
    except openai.BadRequestError as e:
        return {"id": row["id"], "refused": e.message}
    m = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    ok = False
    for n, a in calls:
        try:
            args = json.loads(a)
        except ValueError:
            continue
        ok = ok or (n == name and isinstance(args, dict) and args_valid(args, tool["function"]["parameters"]))
    return {"id": row["id"], "ok": ok, "calls": calls, "content": m.content, "finish": r.choices[0].finish_reason,
            "tau": r.model_extra["timings"]["tau"], "s": round(time.perf_counter() - t0, 2)}


def commit() -> str:
    """The short commit this run is on, ``+dirty`` when tracked files differ from it."""
    root = Path(__file__).resolve().parents[2]
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def load_report(path: Path, pair: str, max_tokens: int) -> dict:
    """The report at PATH to resume (rows already there are skipped), or a new one."""
    if path.exists():
        report = json.loads(path.read_text(encoding="utf-8"))
        if report.get("pair") != pair or report.get("data") != DATA.name:
            raise SystemExit(f"error: {path} holds another pair or data set; pass a new --out")
        if report.get("max_tokens", max_tokens) != max_tokens:
            raise SystemExit(f"error: {path} was run with --max-tokens {report['max_tokens']}; pass the same or a new --out")
        report.setdefault("runs", [])
        report["max_tokens"] = max_tokens
        return report
    return {"pair": pair, "data": DATA.name, "max_tokens": max_tokens, "runs": [], "results": {}}


def merge(report: dict, path: Path) -> None:
    """Takes rows from an earlier report (same pair and data) that REPORT lacks, as a run of their own."""
    old = json.loads(path.read_text(encoding="utf-8"))
    if old.get("pair") != report["pair"] or old.get("data") != report["data"]:
        raise SystemExit(f"error: {path} holds another pair or data set")
    run = len(report["runs"])
    report["runs"].append({"merged_from": path.name, **{k: old[k] for k in ("runs", "max_tokens") if k in old}})
    for key, rows in old.get("results", {}).items():
        have = {o["id"] for o in report["results"].get(key, [])}
        report["results"].setdefault(key, []).extend({**o, "run": run} for o in rows if o["id"] not in have)


def summarize(report: dict, order: dict[str, int]) -> list[str]:
    """Sorts each key's rows into data order; per key the right calls, per choice the equal greedy replies."""
    lines, equal = [], {}
    for key, out in report["results"].items():
        out.sort(key=lambda o: order.get(o["id"], len(order)))
        done = [o for o in out if "refused" not in o]
        lines.append(f"{key}: {sum(o['ok'] for o in done)}/{len(out)} right call with valid arguments"
                     + (f", {len(out) - len(done)} refused" if len(done) < len(out) else ""))
    for choice in dict.fromkeys(k.split("/")[0] for k in report["results"]):
        on = {o["id"]: o for o in report["results"].get(f"{choice}/drafting", [])}
        off = {o["id"]: o for o in report["results"].get(f"{choice}/plain", [])}
        both = [i for i in on if i in off]
        same = sum(on[i].get("calls") == off[i].get("calls") and on[i].get("content") == off[i].get("content") for i in both)
        equal[choice] = {"equal": same, "rows": len(both)}
        lines.append(f"{choice}: greedy replies equal with drafting on and off in {same}/{len(both)} rows")
    report["equal"] = equal
    return lines


def table(report: dict) -> list[str]:
    """The docs' table (right calls / replies with drafting on and off, equal greedy replies / rows) and the runs' lines."""
    res = report["results"]
    L = ["| tool_choice | drafting on (0.5B drafter) | drafting off (`speculative.n_max` 0) | greedy replies equal |", "|---|---|---|---|"]
    for choice, eq in report["equal"].items():
        on, off = res.get(f"{choice}/drafting", []), res.get(f"{choice}/plain", [])
        L.append(f"| {choice} | {sum(o.get('ok', False) for o in on)} / {len(on)} | {sum(o.get('ok', False) for o in off)} / {len(off)} "
                 f"| {eq['equal']} / {eq['rows']} |")
    L.append("")
    for i, run in enumerate(report["runs"]):
        n = sum(o.get("run") == i for out in res.values() for o in out)
        if n:
            what = f"merged from {run['merged_from']}" if "merged_from" in run else (
                f"{run['commit']}, {run['started']} to {run.get('finished', '?')}, "
                f"load {run['load_start'][0]:.1f} to {run.get('load_end', run['load_start'])[0]:.1f}")
            L.append(f"- run {i} ({what}): {n} replies")
    return L


def write(path: Path, report: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="qwen-coder")
    ap.add_argument("--rows", type=int, default=50, help="the first ROWS rows of the data (default 50)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per reply at most (default 64)")
    ap.add_argument("--choices", default="auto,required,named")
    ap.add_argument("--merge", type=Path, action="append", default=[],
                    help="take rows from an earlier report first (repeatable); they are not rerun")
    ap.add_argument("--table", action="store_true", help="only print OUT's table for docs/benchmarks.notes.md (no runs)")
    ap.add_argument("--out", type=Path, required=True,
                    help="the report; written after every reply, and a rerun with the same OUT skips the rows it holds")
    a = ap.parse_args()
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()[: a.rows]]
    order = {row["id"]: i for i, row in enumerate(rows)}
    if a.table:
        report = json.loads(a.out.read_text(encoding="utf-8"))
        summarize(report, order)
        print("\n".join(table(report)))
        return
    report = load_report(a.out, a.pair, a.max_tokens)
    for path in a.merge:
        merge(report, path)
    choices = a.choices.split(",")
    keys = [(c, d) for c in choices for d in (True, False)]
    todo = [(row, c, d) for row in rows for c, d in keys
            if row["id"] not in {o["id"] for o in report["results"].get(f"{c}/{'drafting' if d else 'plain'}", [])}]
    run = {"commit": commit(), "command": "python " + shlex.join(sys.argv), "threads": a.threads,
           "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "load_start": os.getloadavg(), "replies": 0}
    report["runs"].append(run)
    print(f"{len(todo)} replies to get ({len(rows) * len(keys) - len(todo)} already in {a.out})", flush=True)
    write(a.out, report)
    if not todo:
        print("\n".join(summarize(report, order)))
        return
    t0 = time.perf_counter()
    s = LiveServer("--pair", a.pair, "-t", a.threads, "-c", "4096", "--parallel", "1", timeout=600)
    run["load_s"] = round(time.perf_counter() - t0, 1)
    try:
        client = s.client(timeout=600)
        for row, choice, drafting in todo:
            key = f"{choice}/{'drafting' if drafting else 'plain'}"
            o = one(client, s.model, row, None if choice == "auto" else choice, drafting, a.max_tokens)
            report["results"].setdefault(key, []).append({**o, "run": len(report["runs"]) - 1})
            run["replies"] += 1
            run["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            run["load_end"] = os.getloadavg()
            summarize(report, order)
            write(a.out, report)
            print(f"[{time.strftime('%H:%M:%S')}] {row['id']} {key}: {'ok' if o.get('ok') else 'NOT ok'} "
                  f"{o.get('s', '')}s tau {o.get('tau', '')}", flush=True)
    finally:
        s.stop()
    print("\n".join(summarize(report, order)), flush=True)
    write(a.out, report)


if __name__ == "__main__":
    main()
