"""Under concurrency a draft model's decodes cost every slot: where the measured costs say drafting loses, steps are plain.

A slot pool's step waits for the draft model's decodes (one catch-up decode, then one per draft
position, each carrying every drafting slot's row), so what a draft costs is the step's, not one
slot's. The pool runs on a modelled clock (``SlotPool.clock``, advanced only inside llama_decode):
a target decode costs 1 + 0.01 per row (rows nearly free beside the pass, as on a GPU) and a
draft-model decode costs ``draft_decode``. The drafter is the target itself, so every draft is
accepted: drafting would pay if its decodes were free. With them dear (2 steps' worth each) the
step policy must choose plain steps, apart from its one measurement step and rare probes; with
them free (the control) the same pool drafts nearly every step, so the cost is what decides.
"""

from __future__ import annotations

import threading

from localflash.api import load

PROMPTS = ["the clam river stone", "quiet light north seven", "garden market paper window", "cold bright the clam"]


class ModelClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _charge(ctx, clock: ModelClock, cost) -> None:
    inner = ctx._run

    def run(raw, n):
        inner(raw, n)
        clock.now += cost(n)

    ctx._run = run


def _steps(tiny_target, draft_decode: float) -> list[tuple[int, bool]]:
    """(k chosen, probe) of every step of 4 concurrent requests on 4 slots, on the modelled clock."""
    with load(model=str(tiny_target), drafter=str(tiny_target), spec="draft", parallel=4, threads=1, ctx=1024, draft_max=4) as llm:
        pool = llm.pool
        clock = ModelClock()
        pool.clock = clock
        _charge(pool.ctx, clock, lambda n: 1.0 + 0.01 * n)
        _charge(pool.group.ctx, clock, lambda n: draft_decode)
        chosen = []
        choose = pool.policy.choose

        def logged(slots):
            k = choose(slots)
            chosen.append((k, pool.policy.probing))
            return k

        pool.policy.choose = logged
        _wave(llm, PROMPTS, max_tokens=48)
    return chosen


def _wave(llm, prompts: list[str], max_tokens: int) -> list:
    """Prompt i on slot i, all at once; every completion, each with tokens."""
    outs = [None] * len(prompts)

    def go(i):
        outs[i] = llm.start(prompts[i], raw=True, max_tokens=max_tokens, slot=i).completion()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o is not None and o.token_ids for o in outs)
    return outs


def test_dear_draft_model_decodes_make_the_pools_steps_plain(tiny_target):
    steps = _steps(tiny_target, draft_decode=2.0)
    drafting = [i for i, (k, probe) in enumerate(steps) if k and not probe]
    # the first step drafts once to measure what a draft costs (nothing was measured); after that only probes may
    assert len(steps) >= 20 and drafting[:1] == [0] and drafting[1:] == [], steps


def test_free_draft_model_decodes_let_the_same_pool_draft(tiny_target):
    steps = _steps(tiny_target, draft_decode=0.0)
    assert sum(1 for k, _ in steps if k) >= 0.8 * len(steps), steps


def test_prompts_that_join_while_drafting_is_off_are_not_decoded_into_the_draft_model(tiny_target):
    """Once the pool has chosen plain steps, a joining prompt is left out of the draft cache (the next draft,
    a probe, catches up within a window): before, every prompt cost the draft model its whole length."""
    long_prompts = [" ".join([p] * 12) for p in PROMPTS]
    with load(model=str(tiny_target), drafter=str(tiny_target), spec="draft", parallel=4, threads=1, ctx=1024, draft_max=4) as llm:
        pool = llm.pool
        clock = ModelClock()
        pool.clock = clock
        draft_rows = []
        _charge(pool.ctx, clock, lambda n: 1.0 + 0.01 * n)
        _charge(pool.group.ctx, clock, lambda n: draft_rows.append(n) or 2.0)
        _wave(llm, PROMPTS, max_tokens=24)  # the pool measures drafting once, then turns it off
        assert pool.policy.off
        before = len(draft_rows)
        outs = _wave(llm, long_prompts, max_tokens=24)
        taken_in = sum(draft_rows[before:])
    prompt_tokens = sum(o.prompt_tokens for o in outs)
    assert prompt_tokens > 200 and taken_in < prompt_tokens / 2, (taken_in, prompt_tokens)
