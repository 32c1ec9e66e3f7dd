"""Prompt tokens prefilled per turn of 4 agent-like conversations on 4 unified slots: routed by prefix vs rotated.

Each agent resends its whole history every turn (system prompt, then per turn a tool result of
~200 tokens and the model's reply); the turns of the 4 agents interleave. ``routed``: each request
goes where ``LLM.slot_for`` sends it (the server's worker does the same); ``rotated``: agent a's turn t to
slot (a + t) % 4, as a server without prefix routing hands a request to whichever slot is free. The
figures are token counts (prompt tokens minus the cached ones), not timings. Python API, one
process, the tiny target (not yet the real-server trace of issue 39 item 4).

    .venv/bin/python benchmarks/serve/agent_trace_prefill.py [--turns 6]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from localflash import load
from localflash.testing.serve import tiny_models


def tool_result(agent: int, turn: int) -> str:
    return "".join(f"{agent}.{turn}.{i}: def f{i}(x): return x * {i} + {turn}\n" for i in range(12))


def run(target: Path, turns: int, routed: bool) -> list[list[int]]:
    prefilled = [[0] * 4 for _ in range(turns)]
    with load(model=str(target), spec="ngram", threads=1, ctx=8192, parallel=4) as llm:
        convs = [[{"role": "system", "content": f"You are agent {a}. Use the tools."}] for a in range(4)]
        for t in range(turns):
            for a, msgs in enumerate(convs):
                msgs.append({"role": "user", "content": tool_result(a, t)})
                slot = llm.slot_for(msgs, [0, 1, 2, 3]) if routed else (a + t) % 4  # rotated: another agent's slot each turn
                done = llm.chat(msgs, slot=slot, max_tokens=16, temperature=0)
                prefilled[t][a] = done.prompt_tokens - done.cached_tokens
                msgs.append({"role": "assistant", "content": done.text})
    return prefilled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=6)
    args = ap.parse_args()
    target, _ = tiny_models(Path(tempfile.mkdtemp(prefix="lf-trace-")))
    routed, rotated = run(target, args.turns, True), run(target, args.turns, False)
    print("| turn | prefilled, routed (4 agents) | prefilled, rotated (4 agents) |")
    print("|---:|---:|---:|")
    for t in range(args.turns):
        print(f"| {t + 1} | {sum(routed[t])} ({', '.join(map(str, routed[t]))}) | {sum(rotated[t])} ({', '.join(map(str, rotated[t]))}) |")
    print(f"| all | {sum(map(sum, routed))} | {sum(map(sum, rotated))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
