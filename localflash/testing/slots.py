"""Concurrent requests on parallel slots vs the same requests alone, in a process of its own.

Exact mode is chosen once per process, before its first model context (``use_exact_numerics``),
so the slot tests run this module in a subprocess::

    python -m localflash.testing.slots '{"model": ..., "spec": ..., "slots": 4, "cases": ["concurrent"]}'

It prints one JSON object: for each case the replies served alone and the replies served
together, as token ids, which the test compares.
"""

from __future__ import annotations

import json
import sys
import threading

PROMPTS = [
    "the clam river stone quiet",
    " ".join(["north seven garden market paper"] * 3),
    "cold bright window light river stone the clam garden seven market paper north quiet",
    " ".join(["paper window cold"] * 4),
    "seven garden",
]
LENGTHS = [40, 24, 56, 32, 16]  # mixed lengths: short ones finish while long ones run


def sampled(i: int) -> dict:
    return dict(temperature=0.9, top_k=20, seed=100 + i)


def solo(opts: dict) -> tuple[list, list]:
    """Each prompt alone on a one-slot LLM: greedy, and sampled with its seed."""
    from localflash.api import load

    with load(**opts, parallel=1) as llm:
        greedy = [llm.generate(p, max_tokens=n).token_ids for p, n in zip(PROMPTS, LENGTHS)]
        seeded = [llm.generate(p, max_tokens=n, **sampled(i)).token_ids for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
    return greedy, seeded


def concurrent(llm, n_slots: int, with_seeds: bool) -> list:
    """Each prompt on a slot, all at once (prompt i waits for slot i % n_slots); slot 0 first streams a reply it cancels."""
    out: list = [None] * len(PROMPTS)
    ready = threading.Event()

    def cancelled_stream():
        gen = llm.start(PROMPTS[2], raw=True, max_tokens=200, slot=0)
        for i, _chunk in enumerate(gen):
            if i == 3:
                ready.set()
                gen.close()  # the client leaves mid-stream
        ready.set()

    def run(slot: int):
        if slot == 0:
            cancelled_stream()
        ready.wait()
        for i in range(slot, len(PROMPTS), n_slots):
            kw = sampled(i) if with_seeds else {}
            out[i] = llm.start(PROMPTS[i], raw=True, max_tokens=LENGTHS[i], slot=slot, **kw).completion().token_ids

    threads = [threading.Thread(target=run, args=(s,)) for s in range(n_slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main(spec: dict) -> dict:
    from localflash.api import load

    opts = {k: v for k, v in spec.items() if k not in ("slots", "cases")}
    n = spec.get("slots", 4)
    greedy, seeded = solo(opts)
    res: dict = {"solo_greedy": greedy, "solo_sampled": seeded}
    with load(**opts, parallel=n) as llm:
        res["n_slots"] = llm.n_slots
        res["info_slots"] = llm.info().slots
        res["greedy"] = concurrent(llm, n, with_seeds=False)
        if "sampled" in spec.get("cases", ()):
            res["sampled"] = concurrent(llm, n, with_seeds=True)
        if "batch" in spec.get("cases", ()):
            res["batch"] = [c.token_ids for c in llm.generate_batch(PROMPTS * 2, max_tokens=16)]
        res["steps"], res["rows"] = llm.pool.steps, llm.pool.rows_decoded
        res["idle"] = all(s["state"] == "idle" for s in llm.slots())
    return res


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
