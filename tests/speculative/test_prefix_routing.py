"""Prefix-aware routing on a unified KV pool: each turn of a conversation goes to the slot that holds its history.

Three conversations take turns, interleaved, on 4 slots of one unified pool (``LLM.slot_for``
picks among the free slots as the server's worker does). Each turn reuses the whole history the
slot holds (``cached_tokens``: the previous turn's prompt and reply, less the tokens the template
renders differently once a reply is history), and its reply equals the reply of the same messages
on a one-slot LLM that prefills them from scratch. The drafter's state follows the reuse: the
n-gram index, and on the hybrid target MTP's intake and the recurrent checkpoints (a turn resumes
at the checkpoint of the previous prompt's end). A prompt that shares too little with any cache goes
to an empty slot, so no cached conversation is cut.

Not exact mode (unified KV is not byte-exact by construction, config.EXACT_UNIFIED): the reply
equalities are of greedy tokens on the tiny llama. The hybrid's are not checked here: outside exact
mode its rows round differently with the verify batch's size (engine.exact_options), and a reply
of it on a slot did differ from the one-slot LLM's in its 11th token; its slot replies are checked
in exact mode, on split streams, by tests/speculative/test_slots.py.
"""

from __future__ import annotations

import pytest

from localflash import load

TOPICS = ["the sea", "bread", "a mountain"]


@pytest.mark.parametrize("kind", ["ngram", "qwen35-mtp"])
def test_each_turn_reuses_its_conversation_s_slot_and_replies_as_a_fresh_prefill(kind, tiny_target, tiny_qwen35_q4k):
    opts = {"ngram": dict(model=str(tiny_target), spec="ngram"), "qwen35-mtp": dict(model=str(tiny_qwen35_q4k), spec="mtp")}[kind]
    opts |= dict(threads=1, ctx=4096, fixed=True, draft_max=4)
    convs = [[{"role": "user", "content": f"Tell me about {t}."}] for t in TOPICS]
    turns: list[tuple[list[dict], str, int, int]] = []  # (messages, reply, cached tokens, slot)
    with load(**opts, parallel=4) as llm:
        assert llm.info().kv_unified and llm.n_ctx == 4096
        homes: dict[int, int] = {}
        prev_prompt: dict[int, int] = {}
        for turn in range(3):
            for c, msgs in enumerate(convs):
                slot = llm.slot_for(msgs, list(range(4)))
                if turn == 0:
                    assert slot not in homes.values()  # nothing similar cached: an empty slot, not another conversation's
                    homes[c] = slot
                assert slot == homes[c]
                done = llm.chat(msgs, slot=slot, max_tokens=12, temperature=0)
                turns.append(([dict(m) for m in msgs], done.text, done.cached_tokens, slot))
                if turn:  # the history: the last prompt and reply (a hybrid: the last prompt, its checkpoint)
                    floor = prev_prompt[c] - 1 if kind.startswith("qwen35") else prev[c] - 8
                    assert done.cached_tokens >= floor, (turn, c, done.cached_tokens, prev[c], prev_prompt[c])
                    assert llm.slots()[slot]["n_reused"] == done.cached_tokens
                prev_prompt[c] = done.prompt_tokens
                msgs += [{"role": "assistant", "content": done.text}, {"role": "user", "content": f"And more, part {turn + 2}."}]
            prev = {c: llm.slots()[homes[c]]["n_cached"] for c in range(len(convs))}
    if kind.startswith("qwen35"):
        return  # see the module docstring: the hybrid's non-exact replies follow its verify batches, not only its tokens
    with load(**opts, parallel=1) as solo:
        for msgs, text, _cached, _slot in turns:
            solo.reset()
            assert solo.chat(msgs, max_tokens=12, temperature=0).text == text


def test_slot_prompt_similarity_0_turns_prefix_routing_off(tiny_target):
    """``--slot-prompt-similarity 0`` (the benchmark's "not routed"): a conversation's next turn goes to an empty slot,
    not to the one that holds its history; at the default it goes home. An out-of-range value is refused in one line."""
    first = [{"role": "user", "content": "Tell me about the sea."}]
    slots = {}
    for sps in (0.5, 0.0):
        with load(model=str(tiny_target), spec="ngram", threads=1, ctx=1024, parallel=4, slot_prompt_similarity=sps) as llm:
            home = llm.slot_for(first, [0, 1, 2, 3])
            done = llm.chat(first, slot=home, max_tokens=4, temperature=0)
            slots[sps] = (home, llm.slot_for(first + [{"role": "assistant", "content": done.text},
                                                      {"role": "user", "content": "And more."}], [0, 1, 2, 3]))
    assert slots[0.5] == (0, 0) and slots[0.0] == (0, 1)
    from localflash.config import config_from_options
    from localflash.errors import LocalflashError

    with pytest.raises(LocalflashError, match="slot-prompt-similarity must be in"):
        config_from_options(model=str(tiny_target), parallel=4, slot_prompt_similarity=1.5)


def test_a_prompt_that_holds_a_slot_s_last_prompt_goes_there_even_when_the_reply_was_most_of_the_cache(tiny_target):
    """A retry (the same prompt again) and a next turn whose reply comes back changed (a thinking model's
    reasoning dropped) lose only the slot's last reply: they go to that slot and reuse its prompt, although
    the reply was over half of its cache. A prompt of another conversation still goes to an empty slot."""
    first = [{"role": "user", "content": "Tell me about the sea."}]
    with load(model=str(tiny_target), spec="ngram", threads=1, ctx=1024, parallel=4) as llm:
        home = llm.slot_for(first, [0, 1, 2, 3])
        done = llm.chat(first, slot=home, max_tokens=48, temperature=0)
        n_cached = llm.slots()[home]["n_cached"]
        assert done.prompt_tokens < 0.5 * n_cached  # the reply is most of the cache: the share rule alone says no
        assert llm.slot_for(first, [0, 1, 2, 3]) == home
        again = llm.chat(first, slot=home, max_tokens=48, temperature=0)
        assert again.cached_tokens == done.prompt_tokens - 1 and again.text == done.text
        changed = first + [{"role": "assistant", "content": "The sea."}, {"role": "user", "content": "And more."}]
        assert llm.slot_for(changed, [0, 1, 2, 3]) == home
        other = [{"role": "user", "content": "Tell me about bread and how it is baked."}]
        assert llm.slot_for(other, [0, 1, 2, 3]) != home
