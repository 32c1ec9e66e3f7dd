"""A grammar cuts a draft at its first rejected token before verify, and trees and parallel slots take grammars too."""

from __future__ import annotations

import re

import pytest

from localflash.engine import exact_kwargs
from localflash.llama import Context, ContextOptions, Model, ModelOptions
from localflash.speculative import loop
from localflash.speculative.drafter import NgramDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.testing.constrained import GBNF, GBNF_LANGUAGE

EXACT_MODEL, EXACT_CTX = exact_kwargs("llama")  # the tiny F32 llama: exact without the process-wide switch (test_exact.py)
PROMPT = "one two three four five six seven"


class ScriptedDrafter(NgramDrafter):
    """Test-only: proposes the known constrained continuation with the token at draft position ``bad_at`` replaced by ``bad``."""

    name = "scripted"

    def __init__(self, prompt_len: int, continuation: list[int], bad: int, bad_at: int = 2, max_draft: int = 4):
        super().__init__(max_draft)
        self.prompt_len, self.continuation, self.bad, self.bad_at = prompt_len, continuation, bad, bad_at
        self.proposed: list[int] = []

    def propose(self, history, n_past, k):
        i = len(history) - self.prompt_len
        draft = list(self.continuation[i : i + k])
        if len(draft) > self.bad_at:
            draft[self.bad_at] = self.bad
        self.proposed.append(len(draft))
        return draft


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target, ModelOptions(**EXACT_MODEL))


def generate(model, tokens, n, drafter=None, sampling=None):
    """(tokens, stats, rows of every target decode after the prompt's)."""
    ctx = Context(model, ContextOptions(n_ctx=512, n_batch=64, n_ubatch=64, n_outputs_max=9, n_threads=1, **EXACT_CTX))
    engine = Engine(model, ctx, drafter, adaptive=False, draft_max=4 if drafter else None)
    rows, decode = [], ctx.decode
    ctx.decode = lambda toks, n_past, outputs: (rows.append(len(toks)), decode(toks, n_past, outputs))[1]
    st = Stats()
    out = [t for chunk in engine.generate(tokens, n, sampling, st) for t in chunk]
    engine.close()
    return out, st, rows[1:]


def test_a_draft_token_the_grammar_rejects_ends_the_draft_before_verify(target, monkeypatch):
    toks = target.tokenize(PROMPT)
    sp = SamplingParams(grammar=GBNF)
    want, _, _ = generate(target, toks, 48, sampling=sp)
    assert re.fullmatch(GBNF_LANGUAGE, target.detokenize(want[:-1] if target.is_eog(want[-1]) else want))
    bad = target.tokenize(" Zebra", add_special=False)[0]  # a space and a capital: never in the grammar's language

    drafter = ScriptedDrafter(len(toks), want + [0] * 8, bad)
    got, st, rows = generate(target, toks, 48, drafter, sp)
    assert got == want
    # every verify pass holds the last token and the two drafts before the rejected one, and both are accepted
    full = [n for n in drafter.proposed if n > 2]
    assert full and st.grammar_rejected == sum(n - 2 for n in full)
    assert max(rows) == 3 and st.drafted == st.accepted
    assert st.rows == sum(rows)

    monkeypatch.setattr(loop, "trim_draft", lambda sample, draft: draft)  # without the cut: the rejected token costs a row
    drafter = ScriptedDrafter(len(toks), want + [0] * 8, bad)
    got, st, rows = generate(target, toks, 48, drafter, sp)
    assert got == want  # still lossless: the verify row is masked, so the rejected token never matches
    assert max(rows) == 5 and st.accepted < st.drafted


def test_a_rejected_token_early_in_the_draft_leaves_a_plain_step(target):
    toks = target.tokenize(PROMPT)
    sp = SamplingParams(grammar=GBNF)
    want, _, _ = generate(target, toks, 48, sampling=sp)
    bad = target.tokenize(" Zebra", add_special=False)[0]
    got, st, rows = generate(target, toks, 48, ScriptedDrafter(len(toks), want + [0] * 8, bad, bad_at=0), sp)
    assert got == want and st.drafted == 0 and set(rows) == {1}


def test_a_tree_takes_a_grammar_and_stays_lossless(tiny_target, tiny_drafters):
    import json
    import subprocess
    import sys

    job = dict(base=dict(model=str(tiny_target), threads=1, exact=True, fixed=True, ctx=1024), prompts=[PROMPT, PROMPT + " " + PROMPT],
               runs=[dict(spec="none"), dict(spec="draft", drafter=str(tiny_drafters["same"]), tree=8, draft_max=4)], n=48)
    res = subprocess.run([sys.executable, "-m", "localflash.testing.constrained", json.dumps(job)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    plain, tree = json.loads(res.stdout.strip().splitlines()[-1])
    assert {k: v[0] for k, v in tree["replies"].items()} == {k: v[0] for k, v in plain["replies"].items()}
    assert all(v[2] == "stop" for v in plain["replies"].values())
    assert tree["drafted"] > 0 and tree["rejected"] > 0  # the tree's rejected nodes were dropped before verify


def test_parallel_slots_take_grammars_and_equal_solo_replies(tiny_target, tiny_dflash):
    import json
    import subprocess
    import sys

    prompts = [PROMPT, "the cat sat on the mat", PROMPT + " " + PROMPT]
    job = dict(base=dict(model=str(tiny_target), threads=1, exact=True, fixed=True, ctx=2048), prompts=prompts,
               runs=[dict(spec="none"), dict(spec="dflash", drafter=str(tiny_dflash), draft_max=4, parallel=3, batch=True)], n=40)
    res = subprocess.run([sys.executable, "-m", "localflash.testing.constrained", json.dumps(job)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    solo, slots = json.loads(res.stdout.strip().splitlines()[-1])
    assert {k: v[0] for k, v in slots["replies"].items()} == {k: v[0] for k, v in solo["replies"].items()}
    assert slots["drafted"] > 0


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.8, top_k=40, top_p=0.9, seed=1),
                                    dict(temperature=1.0, top_k=8, min_p=0.05, seed=2), dict(temperature=0.7, top_k=0, top_p=0.95, seed=3)],
                         ids=["greedy", "top-k+top-p", "top-k+min-p", "top-p"])
def test_the_windowed_rows_sample_what_the_fully_masked_rows_sample(tiny_target, params):
    """The sampler tries the row's top tokens before masking it whole; its tokens are those of the fully masked row."""
    import numpy as np

    from localflash.llama.grammar import GrammarState
    from localflash.speculative.grammar import ConstrainedSampler
    from localflash.speculative.sampling import Sampler

    model = Model(tiny_target, ModelOptions(vocab_only=True))
    grammar = 'root ::= ([a-z ]+ [0-9]) {1,40}\n'  # lower-case words and digits: a few thousand tokens of the vocabulary allowed
    sp = SamplingParams(grammar=grammar, **params)
    windowed, plain, state = ConstrainedSampler(model, sp), Sampler(sp), GrammarState(model, grammar)
    rng = np.random.default_rng(0)
    for _ in range(120):
        row = (3 * rng.standard_normal(model.n_vocab)).astype(np.float32)
        want = plain(state.mask(row))
        state.accept(want)
        assert windowed(row) == want
    assert windowed.full_masks < windowed.rows if sp.top_k or sp.greedy else windowed.full_masks == windowed.rows


def test_a_grammar_request_on_an_engine_sampling_in_graph_is_sampled_on_the_host_and_the_next_one_in_graph(tiny_target):
    from localflash.api import load

    opts = dict(model=tiny_target, spec="none", threads=1, ctx=512)
    with load(sample_in_graph="on", **opts) as graph, load(sample_in_graph="off", **opts) as host:
        a, b = (llm.generate(PROMPT, max_tokens=32, grammar=GBNF) for llm in (graph, host))
        assert a.token_ids == b.token_ids and a.stats.sampled_in == "host" and a.finish_reason == "stop"
        c, d = (llm.generate(PROMPT, max_tokens=16) for llm in (graph, host))
        assert c.stats.sampled_in == "graph" and c.token_ids == d.token_ids
