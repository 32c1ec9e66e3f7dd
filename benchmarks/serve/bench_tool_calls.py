"""A real model calling tools: the share of replies with a parsable call to the right function and schema-valid arguments.

Rows: the first 50 of BFCL v4 "simple (Python)" (benchmarks/serve/data, Apache-2.0; one
function per row, the user asks for a call of it). Each row goes to ``localflash serve``
through the real ``openai`` client with the function as the only tool, greedy, for
``tool_choice`` auto, required and named, with drafting on (the pair's drafter) and off
(``speculative.n_max`` 0). A reply counts when it has a tool call whose name is the row's
function and whose arguments are valid for its schema (required ones there, no unknown
ones, types and enums right). Greedy replies with and without drafting must be equal.

    python benchmarks/serve/bench_tool_calls.py --pair qwen-coder --out /tmp/tool_calls.json

BFCL writes ``dict``/``float``/``tuple`` types and dotted names; they become ``object``,
``number``, ``array`` and ``_`` (as BFCL's own OpenAI handler does).
"""

from __future__ import annotations

import argparse
import json
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="qwen-coder")
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--choices", default="auto,required,named")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()[: a.rows]]
    s = LiveServer("--pair", a.pair, "-t", a.threads, "-c", "4096", "--parallel", "1", timeout=600)
    report = {"pair": a.pair, "rows": len(rows), "data": str(DATA.name), "results": {}}
    try:
        client = s.client(timeout=600)
        for choice in a.choices.split(","):
            for drafting in (True, False):
                key = f"{choice}/{'drafting' if drafting else 'plain'}"
                out = [one(client, s.model, row, None if choice == "auto" else choice, drafting, a.max_tokens) for row in rows]
                report["results"][key] = out
                done = [o for o in out if "refused" not in o]
                print(f"{key}: {sum(o['ok'] for o in done)}/{len(done)} right call with valid arguments"
                      + (f", {len(out) - len(done)} refused ({out[0]['refused'] if len(done) < len(out) else ''})" if len(done) < len(out) else ""),
                      flush=True)
                a.out.write_text(json.dumps(report, indent=1, ensure_ascii=False))
            on, off = report["results"][f"{choice}/drafting"], report["results"][f"{choice}/plain"]
            same = sum(x.get("calls") == y.get("calls") and x.get("content") == y.get("content") for x, y in zip(on, off))
            report.setdefault("equal", {})[choice] = same
            print(f"{choice}: greedy replies equal with drafting on and off in {same}/{len(rows)} rows", flush=True)
    finally:
        s.stop()
    a.out.write_text(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
