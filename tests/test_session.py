"""The session layer: prefix reuse across turns, and a chat that keeps reusing its cache after the context fills."""

from __future__ import annotations

import pytest

from localflash.config import config_from
from localflash.engine import open_engine
from localflash.session import Conversation, Session
from localflash.speculative.sampling import SamplingParams

TOPICS = ["lighthouses", "rivers", "bread", "owls", "glaciers", "violins", "comets", "tea", "bridges", "moss"]


@pytest.fixture(scope="module")
def small_engine(tiny_target):
    engine = open_engine(config_from(None, str(tiny_target), None, spec="ngram", ctx=512, threads=1))
    yield engine
    engine.close()


def run_turn(conv: Conversation, user: str) -> tuple[int, int, str]:
    """One turn: (prompt tokens, re-decoded prompt tokens, reply)."""
    tokens, text = conv.build_prompt(user)
    done = conv.session.start(tokens, text, max_tokens=conv.max_tokens, sampling=SamplingParams()).completion()
    assert done.stats.cached_tokens == done.cached_tokens
    conv.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": done.text}]
    return done.prompt_tokens, done.prompt_tokens - done.cached_tokens, done.text


def test_turns_reuse_the_cached_prefix_and_match_a_cold_start(small_engine):
    small_engine.reset()
    conv = Conversation(Session(small_engine), system="Be brief.", max_tokens=16)
    first_prompt, redecoded, _ = run_turn(conv, "Tell me about owls.")
    assert redecoded == first_prompt  # nothing cached yet
    prompt, redecoded, warm = run_turn(conv, "And about rivers?")
    assert prompt - redecoded >= first_prompt - 1  # the whole first prompt came from the cache
    small_engine.reset()
    cold = Conversation(Session(small_engine), system="Be brief.", max_tokens=16)
    cold.messages = conv.messages[:2]
    prompt, redecoded, text = run_turn(cold, "And about rivers?")
    assert redecoded == prompt and text == warm  # reusing the cache changed nothing


def test_chat_after_the_context_fills_reuses_its_cache(small_engine):
    """40 turns at a 512-token context: after each trim the following turns re-decode a bounded number of tokens."""
    small_engine.reset()
    conv = Conversation(Session(small_engine), system="You are a terse assistant.", max_tokens=16)
    rows = []  # (turn, prompt tokens, re-decoded, trimmed turns)
    for i in range(40):
        user = f"Turn {i}: tell me one thing about {TOPICS[i % len(TOPICS)]}."
        prompt, redecoded, _ = run_turn(conv, user)
        rows.append((i, prompt, redecoded, conv.last_trim[0]))
    trims = [r for r in rows if r[3]]
    assert len(trims) >= 3, rows  # the context filled several times
    after = [r for r in rows if r[0] > trims[0][0]]
    bound = 16 + 40  # the last reply (16 tokens, re-tokenized) + the new user turn and template tokens
    steady = [r for r in after if not r[3]]
    assert steady and all(r[2] <= bound for r in steady), rows
    # a trim keeps about half the context, so several cheap turns follow each one
    assert all(b[0] - a[0] >= 4 for a, b in zip(trims, trims[1:])), rows
    assert all(r[1] + conv.reserve() <= conv.trim_goal() for r in trims), rows
    assert sum(r[2] for r in after) / len(after) < 512 / 4, rows
    # the old policy (drop only as much as needed, keep=1.0) re-decodes nearly the whole history on every turn once full
    small_engine.reset()
    old = Conversation(Session(small_engine), system="You are a terse assistant.", max_tokens=16, keep=1.0)
    old_rows = []
    for i in range(40):
        prompt, redecoded, _ = run_turn(old, f"Turn {i}: tell me one thing about {TOPICS[i % len(TOPICS)]}.")
        old_rows.append((i, prompt, redecoded, old.last_trim[0]))
    first_old = next(r[0] for r in old_rows if r[3])
    old_after = [r for r in old_rows if r[0] > first_old]
    assert sum(r[2] for r in old_after) / len(old_after) > 512 / 2, old_rows
