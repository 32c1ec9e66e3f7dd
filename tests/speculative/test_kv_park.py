"""Idle slots' caches parked in host memory while another slot runs (unified KV pool: speculative/kv_park.py).

A conversation's first turn finishes on its slot; then another slot runs a request. The idle
slot's sequence leaves the pool (no cells) but keeps its token list, so the next turn is routed
there, put back and reuses the whole history, and its reply equals the reply of a run where
nothing was parked. A parked cache dropped by the host-memory cap, or one whose restore fails,
is an eviction: the next turn prefills from scratch and still gets the same reply.

Not exact mode (unified KV is not byte-exact by construction, config.EXACT_UNIFIED): as in
test_prefix_routing.py the reply equalities are of greedy tokens on the tiny llama, one thread.
"""

from __future__ import annotations

import ctypes
import threading

import pytest

from localflash import load
from localflash.llama.bindings import lib
from localflash.speculative.kv_park import MIN_PARK_TOKENS

OPTS = dict(spec="ngram", threads=1, ctx=2048, fixed=True, draft_max=4, parallel=4)
HOME = [{"role": "user", "content": "Tell me about the sea, " + "the waves, the tides and the ships, " * 8}]
RUNNER = [{"role": "user", "content": "Write a long story about bread."}]
HOME_SLOT, RUNNER_SLOT = 0, 1


def _next_turn(reply: str) -> list[dict]:
    return HOME + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And more, please."}]


def _cells(llm, slot: int) -> int:
    """Positions the target context holds for ``slot``'s sequence (read on the pool's thread, between steps)."""
    pool = llm.pool
    return pool.call(lambda: lib().llama_memory_seq_pos_max(pool.ctx.mem, slot) + 1)


def _start_runner(llm):
    """Another slot's request, running: its first chunk is out (a step ran)."""
    runner = llm.chat(RUNNER, slot=RUNNER_SLOT, stream=True, max_tokens=48, temperature=0)
    next(runner)
    return runner


@pytest.fixture(scope="module")
def unparked(tiny_target):
    """The two turns on a pool where nothing else runs, so nothing is parked: (first reply, next turn's completion)."""
    with load(model=str(tiny_target), **OPTS) as llm:
        assert llm.info().kv_unified and llm.pool.park.on
        assert llm.slot_for(HOME, [0, 1, 2, 3]) == HOME_SLOT
        first = llm.chat(HOME, slot=HOME_SLOT, max_tokens=8, temperature=0)
        nxt = _next_turn(first.text)
        assert llm.slot_for(nxt, [0, 1, 2, 3]) == HOME_SLOT
        second = llm.chat(nxt, slot=HOME_SLOT, max_tokens=12, temperature=0)
        assert llm.pool.park.parks == 0 and second.cached_tokens > 0
        return first.text, second


def test_an_idle_slot_s_cache_leaves_the_pool_while_another_slot_runs_and_keeps_its_tokens(tiny_target):
    with load(model=str(tiny_target), **OPTS) as llm:
        llm.chat(HOME, slot=HOME_SLOT, max_tokens=8, temperature=0)
        n = llm.slots()[HOME_SLOT]["n_cached"]
        assert n >= MIN_PARK_TOKENS
        assert _cells(llm, HOME_SLOT) == n  # nothing else runs: it stays in the pool
        runner = _start_runner(llm)
        assert _cells(llm, HOME_SLOT) == 0
        home = llm.slots()[HOME_SLOT]
        assert home["n_cached"] == n and home["kv_parked"] and home["state"] == "idle"
        assert llm.pool.kv.held(llm.pool.slots[HOME_SLOT]) == 0  # admission sees its cells free
        assert llm.pool.park.parks == 1 and llm.pool.kv.evictions == 0
        for _ in runner:
            pass


def test_the_next_turn_goes_to_its_parked_slot_reuses_the_history_and_replies_as_without_parking(tiny_target, unparked):
    first_text, second_ref = unparked
    with load(model=str(tiny_target), **OPTS) as llm:
        first = llm.chat(HOME, slot=HOME_SLOT, max_tokens=8, temperature=0)
        assert first.text == first_text
        n = llm.slots()[HOME_SLOT]["n_cached"]
        runner = _start_runner(llm)
        assert _cells(llm, HOME_SLOT) == 0
        nxt = _next_turn(first.text)
        slot = llm.slot_for(nxt, [0, 2, 3])
        assert slot == HOME_SLOT
        tokens, _ = llm.sessions[slot].encode(nxt)
        reusable = llm.sessions[slot].cached_prefix(tokens)
        assert reusable >= n - 8  # the history, less what the template renders differently once a reply is history
        second = llm.chat(nxt, slot=slot, max_tokens=12, temperature=0)
        assert llm.pool.park.restores == 1 and llm.pool.park.failed == 0
        assert second.cached_tokens == reusable == second_ref.cached_tokens
        assert llm.slots()[slot]["n_reused"] == reusable  # what the prefill really kept: no re-prefill of the history
        assert second.stats.kv_evicted == 0
        assert second.text == second_ref.text
        for _ in runner:
            pass


@pytest.mark.parametrize("loss", ["dropped by the cap", "restore fails"])
def test_a_parked_cache_that_is_lost_is_an_eviction_and_the_next_turn_prefills_with_the_same_reply(tiny_target, unparked, loss):
    first_text, second_ref = unparked
    with load(model=str(tiny_target), **OPTS) as llm:
        pool = llm.pool
        first = llm.chat(HOME, slot=HOME_SLOT, max_tokens=8, temperature=0)
        assert first.text == first_text
        n = llm.slots()[HOME_SLOT]["n_cached"]
        if loss == "dropped by the cap":
            pool.park.budget = n - 1  # host memory for fewer tokens than this cache
        runner = _start_runner(llm)
        assert _cells(llm, HOME_SLOT) == 0
        if loss == "dropped by the cap":
            assert not pool.park.blobs and llm.slots()[HOME_SLOT]["n_cached"] == 0  # forgotten: routing no longer sees it
        else:
            def truncate():  # a blob llama.cpp cannot read back whole
                blob = pool.park.blobs[HOME_SLOT]
                half = len(blob.data) // 2
                blob.data = (ctypes.c_uint8 * half).from_buffer_copy(bytes(blob.data)[:half])

            pool.call(truncate)
        nxt = _next_turn(first.text)
        slot = llm.slot_for(nxt, [0, 2, 3])
        second = llm.chat(nxt, slot=slot, max_tokens=12, temperature=0)
        assert second.cached_tokens == 0 and llm.slots()[slot]["n_reused"] == 0  # prefilled from scratch
        assert pool.kv.evictions == 1 and pool.kv.evicted_tokens == n
        if loss == "restore fails":
            assert slot == HOME_SLOT and pool.park.failed == 1 and second.stats.kv_evicted == n
        assert second.text == second_ref.text
        for _ in runner:
            pass


def test_parking_is_only_for_a_kv_cache_in_host_memory(monkeypatch):
    """A GPU's or an RPC server's KV would cross PCIe or the network to park: not measured, so not parked."""
    from types import SimpleNamespace

    from localflash.llama.runtime import ModelOptions
    from localflash.speculative import kv_park

    def on(**kw):
        return kv_park.kv_in_host_memory(SimpleNamespace(options=ModelOptions(**kw)))

    assert on(n_gpu_layers=0) and on(devices=[]) and on(devices=["CPU"])
    assert not on(devices=["RPC0"]) and not on(devices=["CUDA0", "CUDA1"])
    # all layers on whatever the build has: host memory on a CPU build, a GPU's memory on a GPU build
    monkeypatch.setattr(kv_park, "gpu_offload_supported", lambda: False)
    assert on()
    monkeypatch.setattr(kv_park, "gpu_offload_supported", lambda: True)
    assert not on() and on(n_gpu_layers=0)


SHORT = [{"role": "user", "content": "Write a long story about the sea."}]  # fewer tokens than MIN_PARK_TOKENS


def test_a_short_prompt_asked_again_is_restored_and_reused_not_prefilled_again(tiny_target):
    """The cache is long enough to park (prompt + reply), the prompt alone is not: asked again while another slot
    runs, it is put back and all of the prompt but its last token comes from it, as when nothing was parked."""
    with load(model=str(tiny_target), **OPTS) as llm:
        first = llm.chat(SHORT, slot=HOME_SLOT, max_tokens=72, temperature=0)
        assert llm.slots()[HOME_SLOT]["n_cached"] >= MIN_PARK_TOKENS > first.prompt_tokens
        ref = llm.chat(SHORT, slot=HOME_SLOT, max_tokens=12, temperature=0)  # nothing else runs: nothing parked
        assert llm.pool.park.parks == 0 and ref.cached_tokens == first.prompt_tokens - 1
    with load(model=str(tiny_target), **OPTS) as llm:
        llm.chat(SHORT, slot=HOME_SLOT, max_tokens=72, temperature=0)
        runner = _start_runner(llm)
        assert _cells(llm, HOME_SLOT) == 0 and llm.slots()[HOME_SLOT]["kv_parked"]
        assert llm.slot_for(SHORT, [0, 2, 3]) == HOME_SLOT
        again = llm.chat(SHORT, slot=HOME_SLOT, max_tokens=12, temperature=0)
        assert llm.pool.park.restores == 1 and llm.pool.kv.evictions == 0
        assert again.cached_tokens == ref.cached_tokens and llm.slots()[HOME_SLOT]["n_reused"] == ref.cached_tokens
        assert again.text == ref.text
        for _ in runner:
            pass


LONG_HOME = [{"role": "user", "content": "Tell me about the sea, " + "the waves, the tides and the ships, " * 60}]
SHARES_ITS_START = [{"role": "user", "content": "Tell me about the sea, the waves, the tides and the ships, the waves."}]
THIRD = [{"role": "user", "content": "Write a long story about a lighthouse."}]


def test_a_prompt_sharing_only_the_start_of_a_parked_cache_that_no_longer_fits_is_prefilled_not_made_to_wait(tiny_target):
    """A long conversation is parked; other requests then reserve the cells it held. A short prompt that shares only
    its first tokens comes to its slot: putting the cache back would take all of its cells to keep a few, so the cache
    is forgotten (an eviction) and the prompt is prefilled at once, where before it waited for the others to finish."""
    with load(model=str(tiny_target), **OPTS) as llm:
        ref = llm.chat(SHARES_ITS_START, slot=HOME_SLOT, max_tokens=8, temperature=0)  # alone: nothing to park
    with load(model=str(tiny_target), **OPTS) as llm:
        pool = llm.pool
        llm.chat(LONG_HOME, slot=HOME_SLOT, max_tokens=4, temperature=0)
        n = llm.slots()[HOME_SLOT]["n_cached"]
        runner = llm.chat(RUNNER, slot=RUNNER_SLOT, stream=True, max_tokens=600, temperature=0)
        next(runner)  # running: the home cache is parked (its cells freed)
        assert llm.slots()[HOME_SLOT]["kv_parked"] and _cells(llm, HOME_SLOT) == 0
        third = llm.chat(THIRD, slot=2, stream=True, max_tokens=2048 - n - 600, temperature=0)
        next(third)  # admitted into the parked cache's cells: the runner and it reserve all but fewer than n cells
        room = pool.kv.capacity - sum(pool.kv.held(s) for s in pool.slots)
        prompt = list(llm.session.encode(SHARES_ITS_START)[0])
        assert room < n and pool.park.restore_cells(pool.slots[HOME_SLOT], prompt) == n  # it would be put back whole
        assert len(prompt) + 8 < room  # while the prompt and its reply fit as they are
        out = {}

        def ask():
            out["reply"] = llm.chat(SHARES_ITS_START, slot=HOME_SLOT, max_tokens=8, temperature=0)

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        t.join(60)  # (before: it waited for room that the unread runner and third never give back)
        assert "reply" in out, "the prompt waited for KV room"
        reply = out["reply"]
        assert pool.kv.waits == 0 and pool.kv.evictions == 1 and pool.kv.evicted_tokens == n and pool.park.restores == 0
        assert reply.cached_tokens == 0 and reply.stats.kv_evicted == n
        assert reply.text == ref.text
        for stream in (runner, third):
            stream.close()
