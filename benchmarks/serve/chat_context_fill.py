"""A scripted many-turn chat past a full context: prompt tokens re-decoded per turn, chunked trim vs one turn at a time.

    .venv/bin/python benchmarks/serve/chat_context_fill.py --pair demo --turns 60 --ctx 1024 --max-tokens 32

``keep 1.0`` is the old policy (drop only as many old turns as needed, every
turn once full); ``keep 0.5`` (the default now) drops down to half the context
in one chunk. Counts are tokens, not times, so a busy machine does not change them.
"""

from __future__ import annotations

import argparse
import json

from localflash.config import config_from
from localflash.engine import open_engine
from localflash.session import Conversation, Session
from localflash.speculative.sampling import SamplingParams

TOPICS = ["lighthouses", "rivers", "bread", "owls", "glaciers", "violins", "comets", "tea", "bridges", "moss", "deserts", "clocks"]


def run(engine, turns: int, max_tokens: int, keep: float) -> list[dict]:
    engine.reset()
    conv = Conversation(Session(engine), system="You are a helpful assistant.", max_tokens=max_tokens, keep=keep)
    rows = []
    for i in range(turns):
        user = f"Turn {i}: tell me one short fact about {TOPICS[i % len(TOPICS)]}."
        tokens, text = conv.build_prompt(user)
        done = conv.session.start(tokens, text, max_tokens=max_tokens, sampling=SamplingParams()).completion()
        conv.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": done.text}]
        rows.append({"turn": i, "prompt": done.prompt_tokens, "redecoded": done.prompt_tokens - done.cached_tokens, "trimmed": conv.last_trim[0]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the per-turn rows here")
    a = ap.parse_args()
    engine = open_engine(config_from(a.pair, None, None, spec="none", ctx=a.ctx, threads=a.threads))
    report = {}
    try:
        for keep in (1.0, 0.5):
            rows = run(engine, a.turns, a.max_tokens, keep)
            first = next((r["turn"] for r in rows if r["trimmed"]), None)
            after = [r for r in rows if first is not None and r["turn"] > first]
            trims = sum(1 for r in rows if r["trimmed"])
            mean = sum(r["redecoded"] for r in after) / len(after) if after else 0.0
            worst = max((r["redecoded"] for r in after), default=0)
            steady = [r["redecoded"] for r in after if not r["trimmed"]]
            print(f"keep {keep}: first trim at turn {first}; {trims} trims in {a.turns} turns; after it: "
                  f"mean {mean:.0f} re-decoded tokens/turn, worst {worst}, between trims ≤ {max(steady, default=0)}")
            report[str(keep)] = rows
    finally:
        engine.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
