"""Hybrid (Gated-DeltaNet) targets decode losslessly whatever the drafter, and every cache cut is right.

qwen35 rolls back through llama.cpp's recurrent-state snapshots (n_rs_seq); qwen3next has none and
goes through checkpoint + replay. Both are compared, token for token at 1 thread, with a fresh plain
decode of the same prompt: speculative modes, chat turns whose prompt diverges inside older history,
``/reset`` and ``/system``, and a planted stale-snapshot cut that must be caught.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from localflash.api import LLM
from localflash.cli.chat import ChatSession
from localflash.cli.chat_ui import PlainUI
from localflash.errors import RollbackError
from localflash.llama import Context, ContextOptions, Model
from localflash.llama.rollback import RecurrentCache, StateCheckpoint
from localflash.config import config_from
from localflash.engine import open_engine
from localflash.speculative.prefill import _common_prefix
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats

N_TOK = 128
_WORDS = ("the clam river stone quiet light north seven garden market paper window cold bright "
          "music story number letter engine salt forest question answer city bridge small").split()


def _prompt_cases() -> list[str]:
    """50 prompts: short and long, repetitive (n-gram food), two past the 512-token batch, and
    continuations of the one before (their cache reuse goes through a checkpoint)."""
    rng = np.random.default_rng(16)
    cases = []
    for i in range(50):
        n = [3, 12, 40][i % 3]
        words = " ".join(rng.choice(_WORDS, n))
        if i % 5 == 1:
            words = " ".join([words] * 3)  # repeats: lookup drafts
        if i in (17, 33):
            words = " ".join(rng.choice(_WORDS, 700))  # longer than one batch
        if i % 7 == 6:
            words = cases[-1] + " and then " + words  # continues the previous prompt
        cases.append(words)
    return cases


PROMPTS = _prompt_cases()


@pytest.fixture(scope="module")
def pool():
    """Engines shared by this module, keyed by what they were opened with."""
    engines = {}

    def get(target, spec="none", drafter=None, fixed=False, draft_max=None):
        key = (str(target), spec, str(drafter), fixed, draft_max)
        if key not in engines:
            cfg = config_from(None, str(target), str(drafter) if drafter else None, spec=spec, ctx=2048,
                              threads=1, adaptive=not fixed, draft_max=draft_max)
            engines[key] = open_engine(cfg)
        return engines[key]

    yield get
    for e in engines.values():
        e.close()


def _run(engine, prompts, n=N_TOK, sampling=None, fresh=False):
    """Outputs of ``engine`` on each prompt (cache kept between prompts unless ``fresh``) and summed stats."""
    total, outs = Stats(), []
    for text in prompts:
        if fresh:
            engine.reset()
        st = Stats()
        outs.append([t for new in engine.generate(engine.target.tokenize(text), n, sampling, st) for t in new])
        total.merge(st)
    return outs, total


@pytest.fixture(scope="module")
def plain(pool):
    """Fresh plain greedy decodes per target (the reference), memoised."""
    memo = {}

    def get(target, prompts=tuple(PROMPTS)):
        key = (str(target), prompts)
        if key not in memo:
            memo[key] = _run(pool(target), prompts, fresh=True)[0]
        return memo[key]

    return get


def _mismatches(got, want) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(got, want)) if a != b]


# (spec, drafter key, fixed, draft_max, what the drafts are)
QWEN35_MODES = [
    ("ngram", None, False, None, ""),
    ("ngram", None, True, None, "mixed"),
    ("draft", "same", True, 8, "right"),  # the target itself: every draft accepted, no rollback
    ("draft", "far", True, 4, "mostly wrong"),
    ("draft", "near", False, None, ""),
    ("dflash", "dflash", False, None, ""),
    ("dflash", "dflash", True, 7, "wrong"),  # a random DFlash block: never accepted, a rollback every cycle
    ("dflash+ngram", "dflash", False, None, ""),
    ("draft+ngram", "near", True, 4, "mixed"),
]


@pytest.mark.parametrize("spec, dkey, fixed, k, drafts", QWEN35_MODES,
                         ids=[f"{m[0]}-{m[1]}-{'fixed' if m[2] else 'adaptive'}" for m in QWEN35_MODES])
def test_qwen35_greedy_is_lossless_for_every_drafter(pool, plain, tiny_qwen35, tiny_qwen35_drafters, tiny_qwen35_dflash,
                                                     spec, dkey, fixed, k, drafts):
    drafter = {"dflash": tiny_qwen35_dflash, None: None}.get(dkey) or tiny_qwen35_drafters.get(dkey)
    outs, st = _run(pool(tiny_qwen35, spec, drafter, fixed, k), PROMPTS)
    assert _mismatches(outs, plain(tiny_qwen35)) == [], st.summary()
    assert len(outs) >= 50 and all(len(o) == N_TOK for o in outs)
    assert st.rollback == "snapshot"
    if drafts == "right":
        assert st.accepted == st.drafted > 0 and st.tau > 4
    elif drafts:  # rejected drafts: each cut a snapshot rollback inside the verify pass
        assert st.drafted > st.accepted and st.snapshot_rollbacks > 0, st.summary()
    if drafts == "mixed":
        assert st.accepted > 0, st.summary()
    if drafts == "mostly wrong":
        assert st.acceptance < 0.05 and st.drafted >= 50 * N_TOK, st.summary()
    if drafts == "wrong":
        assert st.accepted == 0 and st.drafted >= 50 * N_TOK, st.summary()


QWEN3NEXT_MODES = [
    ("ngram", None, False, None),
    ("draft", "same", True, 8),
    ("draft", "far", True, 3),
    ("dflash", "dflash", True, 4),
    ("dflash+ngram", "dflash", False, None),
]


@pytest.mark.parametrize("spec, dkey, fixed, k", QWEN3NEXT_MODES,
                         ids=[f"{m[0]}-{m[1]}-{'fixed' if m[2] else 'adaptive'}" for m in QWEN3NEXT_MODES])
def test_qwen3next_greedy_is_lossless_through_checkpoint_and_replay(pool, plain, tiny_qwen3next, qwen3next_drafters,
                                                                    spec, dkey, fixed, k):
    drafter = qwen3next_drafters[dkey] if dkey else None
    prompts = tuple(PROMPTS[:25]) if fixed else tuple(PROMPTS)
    outs, st = _run(pool(tiny_qwen3next, spec, drafter, fixed, k), prompts)
    assert _mismatches(outs, plain(tiny_qwen3next, prompts)) == [], st.summary()
    assert st.rollback == "replay" and st.snapshot_rollbacks == 0
    if fixed:
        assert st.drafted > 0 and st.checkpoint_restores > 0
    if dkey == "same":
        assert st.accepted == st.drafted


@pytest.fixture(scope="module")
def qwen3next_drafters(tiny_dir, tiny_qwen3next):
    from localflash.formats.dflash_gguf import DFlashSpec
    from localflash.testing.tiny import HybridSpec, write_dflash, write_hybrid

    return {
        "same": write_hybrid(tiny_dir / "qwen3next-draft-same.gguf", HybridSpec(arch="qwen3next", seed=4)),
        "far": write_hybrid(tiny_dir / "qwen3next-draft-far.gguf", HybridSpec(arch="qwen3next", seed=4, n_layer=3, noise=0.6)),
        "dflash": write_dflash(tiny_dir / "qwen3next-dflash.gguf", DFlashSpec(target_layers=[1, 3, 5], seed=6)),
    }


@pytest.mark.parametrize("spec, dkey", [("draft", "near"), ("draft", "same"), ("dflash", "dflash")])
def test_qwen35_same_seed_sampling_equals_plain_sampling(pool, tiny_qwen35, tiny_qwen35_drafters, tiny_qwen35_dflash, spec, dkey):
    drafter = tiny_qwen35_dflash if dkey == "dflash" else tiny_qwen35_drafters.get(dkey)
    sampling = SamplingParams(temperature=0.9, top_k=0, seed=5)
    want, _ = _run(pool(tiny_qwen35), PROMPTS[:8], 64, sampling, fresh=True)
    got, st = _run(pool(tiny_qwen35, spec, drafter, True, 4), PROMPTS[:8], 64, sampling)
    assert _mismatches(got, want) == [] and st.drafted > 0


# -- chat: turns whose prompt diverges inside older history, /system, /reset ---------------

class _UI(PlainUI):
    def __init__(self):
        super().__init__(io.StringIO(), io.StringIO(), io.StringIO())


SCRIPT = ["Tell me about the clammond river.", "Why is it cold?", "RETOKENIZE", "What about the clams?", "EDIT",
          "And the stones?", "/system Answer like a sailor.", "Tell me more.", "/reset",
          "Tell me about the clammond river.", "One more thing."]


@pytest.mark.parametrize("target_fix, spec, dkey", [
    ("tiny_qwen35", "draft+ngram", "near"), ("tiny_qwen35", "none", None), ("tiny_qwen3next", "ngram", None),
])
def test_chat_turns_equal_a_fresh_plain_decode_of_each_rendered_prompt(request, pool, tiny_qwen35_drafters, target_fix, spec, dkey):
    target = request.getfixturevalue(target_fix)
    engine = pool(target, spec, tiny_qwen35_drafters.get(dkey) if dkey else None)
    engine.reset()
    session = ChatSession(LLM(engine), _UI(), SamplingParams(), max_tokens=24)
    reference = pool(target)
    diverged_inside, retokenized = 0, None
    for line in SCRIPT:
        if line == "EDIT":  # an edited earlier message: the next prompt diverges deep in the history
            session.conv.messages[0]["content"] = "Tell me about the clam river instead."
            continue
        if line == "RETOKENIZE":  # the last reply comes back tokenized otherwise (`clam|mond` -> `cl|amm|ond`)
            reply_text = session.conv.messages[-1]["content"]
            session.conv.messages[-1]["content"] = reply_text[: len(reply_text) // 2] + " clammond"
            retokenized = True
            continue
        if line.startswith("/"):
            session.handle(line)
            continue
        tokens, _ = session.conv.build_prompt(line)
        cached = list(engine.tokens)
        keep = _common_prefix(cached, tokens)
        diverged_inside += 0 < keep < len(cached) - 1
        reply = session.turn(line)
        if retokenized:  # diverges inside the last reply: resumes at the checkpoint before it, not at 0
            retokenized = False
            assert 0 < keep < len(cached) - 1 and reply.prompt_tokens == len(tokens)
            if engine.ctx.recurrent:
                assert reply.stats.checkpoint_restores >= 1, reply.stats
        reference.reset()
        want = [t for new in reference.generate(tokens, 24) for t in new]
        assert reply.tokens == want, (line, keep, len(cached))
    assert diverged_inside >= 3  # the re-tokenized reply, the edit and the /system change at least


def test_bench_modes_none_runs_on_a_hybrid_target(lf, tiny_qwen35, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "category": "talk", "turns": [PROMPTS[i], "And then?"]})
                                 for i in range(3)) + "\n")
    r = lf("bench", "-m", tiny_qwen35, "--modes", "none", "--prompts", prompts, "-n", "16", "-t", "1", "--json", "-", "--no-save")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["modes"] == ["none"]


# -- the guard itself --------------------------------------------------------------------

def _continue_inside_history(engine, plain_engine, n_cases=12):
    """Requests whose prompt drops the last 3 tokens of the previous reply and goes on differently."""
    bad = 0
    for text in PROMPTS[:n_cases]:
        engine.reset()
        first = engine.target.tokenize(text)
        reply = [t for new in engine.generate(first, 16) for t in new]
        second = first + reply[:-4] + engine.target.tokenize(" the end", add_special=False)
        got = [t for new in engine.generate(second, 16) for t in new]
        plain_engine.reset()
        bad += got != [t for new in plain_engine.generate(second, 16) for t in new]
    return bad


def test_planted_stale_snapshot_restore_is_caught(pool, tiny_qwen35, monkeypatch):
    """With the guard reduced to what llama.cpp itself accepts, the cut restores stale states and the
    output changes; with the guard, the same requests match a fresh decode."""
    engine, reference = pool(tiny_qwen35, "ngram"), pool(tiny_qwen35)
    assert _continue_inside_history(engine, reference) == 0
    monkeypatch.setattr(RecurrentCache, "rollback_ok", lambda self, p0: p0 >= self.end or p0 <= 0 or self.end - p0 <= self.n_rs_seq)
    assert _continue_inside_history(engine, reference) > 0


def test_context_refuses_a_stale_cut_and_rewinds_through_a_checkpoint(tiny_qwen35, tiny_qwen3next):
    m = Model(tiny_qwen35)
    c = Context(m, ContextOptions(n_ctx=128, n_threads=1, n_rs_seq=4))
    toks = (m.tokenize("the clam river stone quiet light north garden market paper") * 2)[:9]
    c.decode(toks[:5], 0)
    assert c.checkpoint().n == 5
    c.decode(toks[5:], 5)  # positions 5..8
    assert c.rollback_ok(6) and not c.rollback_ok(5) and not c.rollback_ok(3)  # strictly inside the last decode
    with pytest.raises(RollbackError, match="stale recurrent state"):
        c.seq_rm(5)
    c.seq_rm(6)
    assert c.end == 6 and not c.rollback_ok(5)  # a snapshot rollback is single-use until the next decode
    assert c.rewind(5) == 5 and c.counts == {"snapshot": 1, "restore": 1}  # so the checkpoint serves
    assert c.rewind(2) == 0  # nothing saved before 2: empty, the caller prefills again
    n = Model(tiny_qwen3next)
    c2 = Context(n, ContextOptions(n_ctx=128, n_threads=1, n_rs_seq=4))
    assert c2.n_rs_seq == 0 and c2.rollback_path == "replay"  # llama.cpp clamps it: no snapshots for qwen3next


def test_a_checkpoint_that_cannot_be_restored_is_one_clear_error(tiny_qwen35):
    m = Model(tiny_qwen35)
    c = Context(m, ContextOptions(n_ctx=128, n_threads=1, n_rs_seq=4))
    c.decode(m.tokenize("the clam river"), 0)
    good = c.checkpoint()
    broken = StateCheckpoint(good.n, (type(good.data)._type_ * 8)())
    with pytest.raises(RollbackError, match="could not be restored") as e:
        c.restore(broken)
    assert "\n" not in e.value.message and c.end == 0  # the cache is cleared, not left half-restored


def test_draft_max_beyond_the_snapshots_is_one_error_line(lf, tiny_qwen35):
    r = lf("run", "-m", tiny_qwen35, "--spec", "ngram", "--draft-max", "40", "-n", "4", "-t", "1", "--raw", "hi")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "roll back at most 32" in errors[0], r.stderr


def test_verbose_and_stats_name_the_rollback_path(lf, tiny_qwen35, tiny_qwen3next):
    for target, path in ((tiny_qwen35, "snapshot"), (tiny_qwen3next, "replay")):
        r = lf("--verbose", "run", "-m", target, "--spec", "ngram", "--fixed", "-n", "8", "-t", "1", "--raw", "--json", "hi")
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"target cache rollback: {path}" in r.stderr
        stats = json.loads([ln for ln in r.stderr.splitlines() if ln.startswith("{")][-1])
        assert stats["rollback"] == path
