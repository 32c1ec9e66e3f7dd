"""Parallel slots are lossless: every reply equals the same request served alone, for every drafter kind.

Configuration: exact mode (``exact=True``: batch-invariant CPU numerics, see engine.exact_options)
at one thread, and one KV stream per slot (engine.open_engine: ``kv_unified=False``), so a row's
logits do not depend on which other sequences share its batch. That holds for the tiny F32 llama
and for a hybrid whose every matmul weight is a K-quant (the Q4_K_M qwen35 here), not for an F32
hybrid nor any qwen3next (tests/llama/test_exact.py): qwen3next's slots are checked for what they
do (drafts, checkpoint + replay cuts, every request ending), not for equality. Each check runs
``localflash.testing.slots`` in a subprocess (exact mode is per process): requests run
concurrently from threads on the slots of one LLM (more requests than slots: later ones join
between steps), one stream is cancelled mid-way, and each reply is compared token for token with
a one-slot LLM's reply (greedy, and sampled with the same seed). ``fixed`` drafting makes every
step draft, so every step verifies and cuts each slot's cache (KV tails, recurrent snapshots,
checkpoint + replay on qwen3next); each check also asserts that it did: two or more slots in one
step, drafted tokens for every kind but ``none``, and accepted ones where the drafter can be right.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localflash.api import load
from localflash.errors import ContextOverflow
from localflash.testing.tiny import (DFlash2Spec, DFlashSpec, Eagle3Spec, HybridSpec, TinySpec, write_dflash, write_dflash2,
                                     write_eagle3, write_hybrid, write_target)

WORDS = "the clam river stone quiet light north seven garden market paper window cold bright".split()


@pytest.fixture(scope="module")
def files(tiny_dir, tiny_target, tiny_qwen35_q4k, tiny_qwen3next, wide_hybrid):
    return {
        "none": (tiny_target, None),
        "ngram": (tiny_target, None),
        "draft": (tiny_target, write_target(tiny_dir / "slots-draft.gguf", TinySpec(n_layer=4, seed=0, noise=0.1))),
        "dflash": (tiny_target, write_dflash(tiny_dir / "slots-dflash.gguf", DFlashSpec(target_layers=[1, 2, 3], block_size=8))),
        "dflash2": (tiny_target, write_dflash2(tiny_dir / "slots-dflash2.gguf", DFlash2Spec(target_layers=[1, 2, 3]))),
        "dflash+ngram": (tiny_target, write_dflash(tiny_dir / "slots-dflash.gguf", DFlashSpec(target_layers=[1, 2, 3], block_size=8))),
        "eagle3": (tiny_target, write_eagle3(tiny_dir / "slots-eagle3.gguf", Eagle3Spec(echo=4.0, fc_scale=0.3))),
        # the hybrid is the K-quant one (exact in exact mode); its MTP block mostly repeats the trunk's guess
        "qwen35-none": (tiny_qwen35_q4k, None),
        "qwen35-ngram": (tiny_qwen35_q4k, None),
        "qwen35-draft": (tiny_qwen35_q4k, write_hybrid(tiny_dir / "slots-q35w-draft.gguf", HybridSpec(seed=3, noise=0.1, **wide_hybrid))),
        "qwen35-mtp": (tiny_qwen35_q4k, None),
        "qwen35-dflash": (tiny_qwen35_q4k, write_dflash(tiny_dir / "slots-q35w-dflash.gguf",
                                                        DFlashSpec(n_embd=256, target_layers=[1, 3, 5], block_size=8, seed=5))),
        "qwen3next-dflash": (tiny_qwen3next, write_dflash(tiny_dir / "slots-q3n-dflash.gguf", DFlashSpec(target_layers=[1, 3, 5], block_size=8, seed=6))),
    }


def _options(files, kind: str) -> dict:
    target, drafter = files[kind]
    spec = kind.split("-")[-1].replace("dflash2", "dflash")
    return dict(model=str(target), drafter=str(drafter) if drafter else None, spec=spec, exact=True, threads=1, ctx=2048,
                fixed=True, draft_max=4)


def _check(opts: dict, slots: int, cases: tuple[str, ...]) -> dict:
    run = subprocess.run([sys.executable, "-m", "localflash.testing.slots", json.dumps({**opts, "slots": slots, "cases": list(cases)})],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


KINDS = ["none", "ngram", "draft", "dflash", "dflash2", "dflash+ngram", "eagle3",
         "qwen35-none", "qwen35-ngram", "qwen35-draft", "qwen35-mtp", "qwen35-dflash"]
# where a drafter can be right: n-gram on the echoed prompts (localflash.testing.slots.echo_prompts) of a llama,
# which replies to a repeated prompt as it did the first time (a random hybrid does not: its recurrent state differs),
# a draft model that is a noisy copy of its target, the echoing EAGLE-3 and the agreeing MTP block; a random DFlash
# block is (almost) never right
CAN_ACCEPT = {"ngram", "draft", "eagle3", "qwen35-draft", "qwen35-mtp"}


def _drafting_ran(r: dict, kind: str) -> None:
    """The slots shared steps and drafted: a model drafter in both cases (``fixed``: every step), the n-gram lookup
    at least greedy (on the echoed prompts; sampled text need not repeat); and accepted where the drafter can be right."""
    assert r["most_active"] >= 2, r["most_active"]  # two or more slots in one step's decode
    greedy, sampled = r["counts_greedy"], r["counts_sampled"]
    if kind.endswith("none"):
        assert greedy["drafted"] == sampled.get("drafted", 0) == 0, (greedy, sampled)
        return
    assert greedy["drafted"] > 0, greedy
    if kind.split("-")[-1] != "ngram" and "sampled" in r:
        assert sampled["drafted"] > 0, sampled
    if kind in CAN_ACCEPT:
        assert greedy["accepted"] + sampled.get("accepted", 0) > 0, (greedy, sampled)


GREEDY_ONLY = {"qwen35-none", "qwen35-draft", "qwen35-dflash"}  # the K-quant hybrid's sampled replies: with n-gram and MTP


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_replies_equal_solo_replies(files, kind):
    r = _check(_options(files, kind), 4, () if kind in GREEDY_ONLY else ("sampled",))
    assert r["n_slots"] == 4 and r["info_slots"] == 4
    assert r["greedy"] == r["solo_greedy"]
    assert r.get("sampled", []) == r["solo_sampled"]
    _drafting_ran(r, kind)
    assert r["idle"]


def test_qwen3next_slots_draft_and_cut_by_checkpoint_and_replay(files):
    """qwen3next is not exact in exact mode (this F32 file, and a Q4_K_M one whose expert router stays F32), so its
    concurrent replies are not claimed equal to solo ones; what is checked: shared steps, drafts, cuts by checkpoint
    restore + replay (no snapshot reaches back there), every request ended at its length or the model's end, idle after."""
    from localflash.testing.slots import LENGTHS

    kind = "qwen3next-dflash"
    r = _check(_options(files, kind), 4, ("sampled",))
    _drafting_ran(r, kind)
    for case in ("counts_greedy", "counts_sampled"):
        assert r[case]["checkpoint_restores"] > 0 and r[case]["snapshot_rollbacks"] == 0, r[case]
    for replies in (r["greedy"], r["sampled"]):
        assert all(0 < len(got) <= n for got, n in zip(replies, LENGTHS))
    assert r["idle"]


def test_eight_slots_and_generate_batch_equal_solo(files):
    r = _check(_options(files, "ngram") | {"fixed": False}, 8, ("batch",))
    assert r["greedy"] == r["solo_greedy"]
    assert r["batch"] == [g[:16] for g in r["solo_greedy"]] * 2  # more prompts than slots


def test_adaptive_step_policy_stays_lossless_on_a_hybrid(files):
    r = _check(_options(files, "qwen35-mtp") | {"fixed": False}, 4, ())
    assert r["greedy"] == r["solo_greedy"]


def test_prompt_larger_than_a_slot_is_refused_with_the_slot_share(files):
    opts = _options(files, "none") | {"ctx": 1024, "exact": False, "kv_pool": "split"}  # a unified pool: tests/serve/test_kv_pool.py
    with load(**opts, parallel=4) as llm:
        share = llm.n_ctx
        assert share == 256  # 1024 tokens shared by 4 slots
        with pytest.raises(ContextOverflow, match=f"one slot holds {share} "):
            llm.start(" ".join(WORDS * 30), raw=True, max_tokens=4, slot=1)
        assert llm.generate("the clam", max_tokens=4).finish_reason == "length"


def test_the_pools_calibration_is_reported_by_the_request_that_met_it(files):
    """The slot pool times its step costs once, before the first request's prefill: that request's Stats.t_calibrate."""
    opts = _options(files, "ngram") | {"exact": False, "fixed": False, "ctx": 1024}
    with load(**opts, parallel=2) as llm:
        first = llm.generate("the clam river", max_tokens=6).stats
        second = llm.generate("the clam river stone", max_tokens=6).stats
    assert first.t_calibrate > 0 and second.t_calibrate == 0
    assert "calibration" in first.summary() and "calibration" not in second.summary()


@pytest.mark.parametrize("kind", ["ngram", "dflash", "qwen35-ngram"])
def test_a_long_prompt_joins_in_chunks_while_another_slot_streams(files, kind):
    """The joining prompt goes in a chunk a step (continuous batching), not all at once ahead of the steps.

    (In the steps' decodes; on a hybrid in exact mode in chunks of n_batch decoded alone, see SlotPool._alone.)

    Slot 0 streams the whole time. A prompt of many chunks joins on slot 1: slot 0's steps go on
    (and it gets emits) between the join and the joiner's first token, and /slots shows slot 1 in state ``prefill`` at
    more than one count of prompt tokens done. Its reply equals its reply alone. Then a request on
    slot 1 is cancelled mid-prefill: its slot is freed, and the next request there, whose prompt
    shares a prefix with the cancelled one (the part already in the cache is reused), still gets
    its solo reply.
    """
    r = _check(_options(files, kind) | {"ctx": 4096}, 2, ("prefill",))
    n = r["long_tokens"]
    assert n > 10 * 63  # many of exact mode's 63-row micro-batches
    assert r["steps_during_prefill"] >= 3 and r["emits_during_prefill"] > 0  # whole-prompt admission: at most one step
    partial = [d for d in r["prefill_done_seen"] if 0 < d < n]
    assert len(partial) >= 2, r["prefill_done_seen"]
    solo = r["solo_late"]
    assert r["long"] == solo["long"]
    assert r["cancelled_finish"] == "cancelled" and r["cancelled_tokens"] == 0
    assert r["slot_after_cancel"] == "idle" and 0 < r["cached_after_cancel"] < n  # a prefix of it stays cached, consistent
    assert r["after"] == solo["after"]
    assert r["idle"]


def test_a_drafter_that_never_pays_probes_on_one_slot_in_turn(files):
    """Adaptive (no ``--fixed``) with a random DFlash drafter, which is (almost) never right: the step policy turns
    drafting off for the whole batch, and from then on a step that drafts is a probe on one slot only, each slot in
    turn (step_policy.py), so a probe costs the batch one slot's draft and rows. Watched at the pool: which slots each
    of the drafter group's calls asked for."""
    import threading

    opts = _options(files, "dflash") | {"exact": False, "fixed": False, "ctx": 4096}
    with load(**opts, parallel=2) as llm:
        pool, asked = llm.pool, []
        # a modelled clock (advanced only inside llama_decode), so what the policy measures does not hang on the host's
        # load: a target decode costs 1 + 0.01 a row (rows nearly free, as on a GPU), a drafter decode 0.5
        clock = [0.0]
        pool.clock = lambda: clock[0]
        for ctx, cost in ((pool.ctx, lambda n: 1.0 + 0.01 * n), (pool.group.ctx, lambda n: 0.5)):
            def run(raw, n, inner=ctx._run, cost=cost):
                inner(raw, n)
                clock[0] += cost(n)
            ctx._run = run
        propose = pool.group.propose

        def watched(asks):
            asked.append((pool.steps, pool.policy.probe_slot is not None, [a[0] for a in asks]))
            return propose(asks)

        pool.group.propose = watched
        threads = [threading.Thread(target=lambda i=i: llm.start(WORDS[i] + " " + WORDS[i + 3], raw=True, max_tokens=700,
                                                               slot=i).completion()) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        steps, most = pool.steps, pool.most_active
    assert most == 2
    probes = [(step, slots) for step, probe, slots in asked if probe]
    assert len(probes) >= 2 and all(len(slots) == 1 for _, slots in probes), asked  # a probe drafts on one slot
    assert [slots[0] for _, slots in probes[:2]] == [0, 1], probes  # in turn
    assert all(step < probes[0][0] for step, probe, _ in asked if not probe), asked  # off after the first tries, for good
    assert len(asked) < steps / 20, (len(asked), steps)  # plain batched steps nearly all the time


IN_GRAPH_PROMPTS = 5  # localflash.testing.slots.PROMPTS


@pytest.mark.parametrize("kind", ["none", "draft", "dflash", "qwen35-mtp"])
def test_slots_sampling_in_the_graph_reply_as_plain_decoding_of_each_request(files, kind):
    """``--sample-in-graph on`` (forced: ``auto`` stays off on a CPU): every slot's sequence samples with its request's
    own chain. Each reply equals the same request decoded plainly (no drafter) on a one-slot LLM sampling in the graph:
    greedy; sampled with a seed of its own (the slot's chain draws the stream a one-stream chain of that seed draws:
    graph_sampling.py's transactional ``dist``); and ``mixed`` (localflash.testing.slots.mixed): greedy, three filter
    settings with their own temperatures and seeds, and a grammar request (sampled on the host, its slot's chain
    detached: graph_sampler.slot_sampler) in the same steps. ``fixed`` drafting: every step drafts, verifies and cuts
(the K-quant hybrid with MTP: snapshot rollbacks and checkpoint restores)."""
    r = _check(_options(files, kind) | {"sample_in_graph": "on", "solo_plain": True}, 4, ("sampled", "mixed"))
    assert r["greedy"] == r["solo_greedy"]
    assert r["sampled"] == r["solo_sampled"]
    assert r["mixed"] == r["solo_mixed"]
    assert len(set(map(tuple, r["sampled"]))) == IN_GRAPH_PROMPTS and r["sampled"] != r["greedy"]  # the seeds drew distinct replies
    assert r["counts_greedy"]["in_graph"] == r["counts_sampled"]["in_graph"] == IN_GRAPH_PROMPTS
    assert r["counts_mixed"]["in_graph"] == IN_GRAPH_PROMPTS - 1  # the grammar request went to the host
    assert r["most_active"] >= 2
    if kind != "none":
        assert all(r[f"counts_{c}"]["drafted"] > 0 for c in ("greedy", "sampled", "mixed"))
    if kind == "draft":  # a noisy copy of the target: drafts are accepted (and some rejected: cuts)
        assert r["counts_greedy"]["accepted"] > 0 and r["counts_sampled"]["accepted"] > 0
    assert r["idle"]
