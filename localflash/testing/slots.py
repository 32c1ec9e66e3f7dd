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
import time

PROMPTS = [
    "the clam river stone quiet",
    " ".join(["north seven garden market paper"] * 3),
    "cold bright window light river stone the clam garden seven market paper north quiet",
    " ".join(["paper window cold"] * 4),
    "seven garden",
]
LENGTHS = [40, 24, 56, 32, 16]  # mixed lengths: short ones finish while long ones run
LONG = " ".join(PROMPTS * 30)  # a joining prompt of many chunks (~1,500 tokens; exact mode: micro-batches of 63 rows)
DROPPED = "quiet " + LONG  # cancelled mid-prefill (not LONG's cached prefix: its prefill starts at 0)
AFTER = "quiet " + " ".join(PROMPTS * 15) + " cold bright window"  # reuses the part of DROPPED that a cancel left in the cache
LATE = {LONG: 12, AFTER: 12}  # the prefill case's reply lengths


ECHOED = (1, 3)  # these prompts also get their own greedy reply once (echo_prompts): a random target seldom repeats itself


def echo_prompts(llm) -> None:
    """PROMPTS with prompts ECHOED as ``prompt + its greedy reply + " " + prompt`` (in place: every function here
    reads PROMPTS): a llama target, near-Markov, replies to the repeated prompt much as it did the first time, so
    the n-gram lookup finds what follows. ``llm``: a one-slot LLM (its greedy reply is plain decoding's)."""
    for i in ECHOED:
        PROMPTS[i] = PROMPTS[i] + llm.generate(PROMPTS[i], max_tokens=LENGTHS[i], raw=True).text + " " + PROMPTS[i]


def sampled(i: int) -> dict:
    return dict(temperature=0.9, top_k=20, seed=100 + i)


def mixed(i: int) -> dict:
    """Prompt i's settings in the ``mixed`` case: greedy, three filters and temperatures with their own seeds, and a
    grammar (sampled on the host on a graph-sampling pool: graph_sampler.slot_sampler) side by side in one step."""
    from localflash.testing.constrained import GBNF

    return [{}, dict(temperature=0.7, top_k=40, top_p=0.9, seed=5), dict(temperature=1.0, top_k=0, seed=6),
            dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7), dict(temperature=0.8, top_k=20, seed=9, grammar=GBNF)][i]


CASES = {"greedy": lambda i: {}, "sampled": sampled, "mixed": mixed}  # each reply's settings by prompt, per case


def solo(opts: dict, cases=("greedy", "sampled")) -> dict:
    """Each prompt alone on a one-slot LLM, with each case's settings (n-gram: on echo_prompts): case -> token ids."""
    from localflash.api import load

    with load(**opts, parallel=1) as llm:
        if "ngram" in (opts.get("spec") or ""):
            echo_prompts(llm)
        return {case: [llm.generate(p, max_tokens=n, **CASES[case](i)).token_ids for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))]
                for case in cases}


def solo_late(opts: dict) -> dict:
    from localflash.api import load

    with load(**opts, parallel=1) as llm:
        return {"long": llm.generate(LONG, max_tokens=LATE[LONG]).token_ids, "after": llm.generate(AFTER, max_tokens=LATE[AFTER]).token_ids}


def joining(llm) -> dict:
    """Slot 0 streams while LONG joins on slot 1, then while DROPPED, cancelled mid-prefill, frees slot 1 for AFTER.

    Returns the steps decoded and what slot 0 emitted while LONG was prefilling, the prompt tokens done that slot 1's /slots
    entry showed meanwhile, LONG's reply, the cancelled request's finish and AFTER's reply.
    """
    emits: list[float] = []
    seen: list[int] = []
    started, stop, first = threading.Event(), threading.Event(), threading.Event()

    def stream():
        while not stop.is_set():
            gen = llm.start(PROMPTS[2], raw=True, max_tokens=200, slot=0)
            for _chunk in gen:
                emits.append(time.perf_counter())
                started.set()
                if stop.is_set():
                    gen.close()  # the client leaves: the slot is freed before the next step
                    break

    def watch():  # what /slots shows for slot 1 until its first token
        while not first.is_set():
            s1 = llm.slots()[1]
            if s1["state"] == "prefill":
                seen.append(s1.get("prompt_done", -1))
            time.sleep(0.0005)

    streamer = threading.Thread(target=stream)
    streamer.start()
    started.wait()
    out: dict = {"long_tokens": llm.count_tokens(LONG, raw=True)}
    watcher = threading.Thread(target=watch)
    watcher.start()
    t0, steps0 = time.perf_counter(), llm.pool.steps
    gen = llm.start(LONG, raw=True, max_tokens=LATE[LONG], slot=1)
    next(gen)
    t1, out["steps_during_prefill"] = time.perf_counter(), llm.pool.steps - steps0
    first.set()
    watcher.join()
    out["emits_during_prefill"] = sum(t0 < t < t1 for t in emits)
    out["prefill_done_seen"] = sorted(set(seen))
    out["long"] = gen.completion().token_ids
    cancel = threading.Event()
    box: dict = {}
    waiting = threading.Thread(target=lambda: box.update(c=llm.start(DROPPED, raw=True, max_tokens=8, slot=1, cancel=cancel).completion()))
    waiting.start()
    deadline = time.time() + 30
    while time.time() < deadline and not (llm.slots()[1]["state"] == "prefill" and llm.slots()[1].get("prompt_done", 0) >= 300):
        time.sleep(0.0005)
    cancel.set()
    waiting.join()
    out["cancelled_finish"], out["cancelled_tokens"] = box["c"].finish_reason, len(box["c"].token_ids)
    out["cached_after_cancel"] = llm.slots()[1]["n_cached"]
    out["slot_after_cancel"] = llm.slots()[1]["state"]
    out["after"] = llm.start(AFTER, raw=True, max_tokens=LATE[AFTER], slot=1).completion().token_ids
    stop.set()
    streamer.join()
    return out


def concurrent(llm, n_slots: int, case: str = "greedy", counts: dict | None = None) -> list:
    """Each prompt on a slot, all at once (prompt i waits for slot i % n_slots, with ``case``'s settings); slot 0 first
    streams a reply it cancels.

    ``counts`` adds up the replies' drafted and accepted tokens, their cache cuts by kind (their Stats) and how many
    were sampled in llama.cpp's graph (``in_graph``)."""
    out: list = [None] * len(PROMPTS)
    lock = threading.Lock()
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
            kw = CASES[case](i)
            done = llm.start(PROMPTS[i], raw=True, max_tokens=LENGTHS[i], slot=slot, **kw).completion()
            out[i] = done.token_ids
            if counts is not None:
                with lock:
                    for key in ("drafted", "accepted", "checkpoint_restores", "snapshot_rollbacks"):
                        counts[key] = counts.get(key, 0) + getattr(done.stats, key)
                    counts["in_graph"] = counts.get("in_graph", 0) + (done.stats.sampled_in == "graph")

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
    cases = spec.get("cases", ())
    plain = {"spec": "none", "drafter": None} if spec.get("solo_plain") else {}  # the solo replies by plain decoding
    opts = {k: v for k, v in opts.items() if k != "solo_plain"}
    alone = solo(opts | plain, ["greedy"] + [c for c in ("sampled", "mixed") if c in cases]) if "prefill" not in cases else {"greedy": []}
    res: dict = {f"solo_{case}": replies for case, replies in alone.items()}
    res.setdefault("solo_sampled", [])
    if "prefill" in cases:  # a case of its own: the long prompts alone first, then joining
        res["solo_late"] = solo_late(opts)
        with load(**opts, parallel=n) as llm:
            res |= joining(llm)
            res["idle"] = all(s["state"] == "idle" for s in llm.slots())
        return res
    with load(**opts, parallel=n) as llm:
        res["n_slots"] = llm.n_slots
        res["info_slots"] = llm.info().slots
        res["counts_greedy"], res["counts_sampled"], res["counts_mixed"] = {}, {}, {}
        for case in ["greedy"] + [c for c in ("sampled", "mixed") if c in cases]:
            res[case] = concurrent(llm, n, case, counts=res[f"counts_{case}"])
        if "batch" in spec.get("cases", ()):
            res["batch"] = [c.token_ids for c in llm.generate_batch(PROMPTS * 2, max_tokens=16)]
        res["steps"], res["rows"], res["most_active"] = llm.pool.steps, llm.pool.rows_decoded, llm.pool.most_active
        res["idle"] = all(s["state"] == "idle" for s in llm.slots())
    return res


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
