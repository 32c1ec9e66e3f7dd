"""The prompt sets benchmarks run on: Spec-Bench and HumanEval (packaged in ``localflash/data``), or a JSONL file.

The one loader of both sets: ``localflash bench`` (:func:`load_prompts`), the
benchmark scripts (:func:`spec_bench_groups`, :func:`humaneval`) and the drafter
τ evaluation read them here. HumanEval problems go to a model wrapped in an
instruction; two wrappers are in use, each for its own figures (see their notes).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from localflash.errors import LocalflashError

PROMPT_SETS = ("spec_bench", "humaneval")
PROMPT_SET_FILES = {"spec_bench": "spec_bench.jsonl.gz", "humaneval": "humaneval.jsonl.gz"}

# HumanEval as the DFlash benchmark wraps a problem: `localflash bench --prompts humaneval` and the drafter τ figures
HUMANEVAL_DFLASH_INSTRUCTION = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
# HumanEval in the speed and conformance scripts (benchmarks/speed, benchmarks/conformance, device_check): their figures
HUMANEVAL_COMPLETE_INSTRUCTION = "Complete the following Python function.\n```python\n{prompt}\n```"

# Spec-Bench's thirteen categories in its six groups: MT-Bench's eight count as one (mt_bench), the other five as they are.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass
class BenchPrompt:
    id: str
    category: str
    text: str  # the user message (chat) or the raw prompt


def prompt_set_file(name: str) -> Path:
    """The packaged file of a named prompt set (``localflash/data``; licences in ``data/licenses``)."""
    path = Path(__file__).resolve().parents[1] / "data" / PROMPT_SET_FILES[name]
    if not path.is_file():
        raise LocalflashError(
            f"prompt set file not found: {path}",
            hint="the named sets ship with localflash: reinstall it (pip install -e .), "
            "or pass your own with --prompts FILE.jsonl",
        )
    return path


def prompt_set_rows(name: str) -> list[dict]:
    """The rows of a named prompt set, as in its upstream JSONL (for scripts)."""
    return [row for _, row in _jsonl_rows(prompt_set_file(name))]


def _jsonl_rows(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise LocalflashError(f"{path}:{lineno}: not JSON ({e.msg})", hint="one JSON object per line") from e
            if not isinstance(row, dict):
                raise LocalflashError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, row


def _prompt_text(row: dict) -> str | None:
    for key in ("prompt", "text", "question", "instruction"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    msgs = row.get("messages")
    if isinstance(msgs, list):
        users = [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[0], str):
            return users[0]
    return None


def humaneval(n: int | None, instruction: str, strip: bool = False) -> list[BenchPrompt]:
    """The first ``n`` HumanEval problems (all: None) wrapped in ``instruction`` (``strip``: the problem's outer whitespace off)."""
    rows = prompt_set_rows("humaneval")[:n]
    return [BenchPrompt(r["task_id"], "humaneval", instruction.format(prompt=r["prompt"].strip() if strip else r["prompt"])) for r in rows]


def spec_bench_groups(per_group: int, spread_mt_bench: bool = False) -> list[BenchPrompt]:
    """The first ``per_group`` first-turn Spec-Bench prompts of each of its six groups (ids ``sb<question_id>``).

    ``spread_mt_bench``: MT-Bench's prompts taken round-robin over its eight sub-categories
    (else the first ones in the file: writing first).
    """
    rows = prompt_set_rows("spec_bench")
    if spread_mt_bench:
        by_cat = {c: [r for r in rows if r["category"] == c] for c in MT_BENCH_CATEGORIES}
        mt = [r for i in range(max(map(len, by_cat.values()))) for c in MT_BENCH_CATEGORIES for r in by_cat[c][i : i + 1]]
        rows = mt + [r for r in rows if r["category"] not in MT_BENCH_CATEGORIES]
    out: list[BenchPrompt] = []
    seen: dict[str, int] = {}
    for r in rows:
        group = "mt_bench" if r["category"] in MT_BENCH_CATEGORIES else r["category"]
        if seen.get(group, 0) >= per_group:
            continue
        seen[group] = seen.get(group, 0) + 1
        out.append(BenchPrompt(f"sb{r['question_id']}", group, r["turns"][0]))
    return out


def load_prompts(spec: str, limit: int | None = None) -> tuple[str, list[BenchPrompt]]:
    """Prompts of a named set (``spec_bench``, ``humaneval``) or a JSONL file; ``limit`` per category.

    Spec-Bench uses the first turn of each question. JSONL rows need ``prompt``
    (or ``text``/``question``/``turns``/``messages``) and may name a ``category``.
    """
    prompts: list[BenchPrompt] = []
    if spec == "spec_bench":
        for lineno, row in _jsonl_rows(prompt_set_file("spec_bench")):
            prompts.append(BenchPrompt(str(row.get("question_id", lineno)), row.get("category", "spec_bench"), row["turns"][0]))
        name = "spec_bench"
    elif spec == "humaneval":
        prompts = humaneval(None, HUMANEVAL_DFLASH_INSTRUCTION)
        name = "humaneval"
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise LocalflashError(
                f"--prompts {spec!r} is neither a prompt set nor a file",
                hint=f"use {' or '.join(PROMPT_SETS)}, or a JSONL file with a \"prompt\" field per line",
            )
        for lineno, row in _jsonl_rows(path):
            text = _prompt_text(row)
            if text is None:
                raise LocalflashError(f"{path}:{lineno}: no prompt", hint='give each line a "prompt" (or "text", "turns", "messages")')
            pid = row.get("id", row.get("question_id", row.get("task_id", lineno)))
            prompts.append(BenchPrompt(str(pid), str(row.get("category", path.stem)), text))
        name = str(path)
    if not prompts:
        raise LocalflashError(f"{name}: no prompts")
    if limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in prompts:
            if seen.get(p.category, 0) < limit:
                kept.append(p)
                seen[p.category] = seen.get(p.category, 0) + 1
        prompts = kept
    return name, prompts
