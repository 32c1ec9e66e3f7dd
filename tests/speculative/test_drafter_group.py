"""The slots' drafters on one shared multi-sequence drafter context (speculative/group.py, DFlashGroup).

Real tiny models throughout: a 4-layer llama target and random DFlash / DFlash2 drafters tapping it.
A group's draft decode carries every drafting slot's block; these check that each slot drafts what
its own drafter alone would, that no slot sees another's content, and that a slot pool's step costs
the shared context one intake decode and one draft decode, whatever the number of slots.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from localflash.api import load
from localflash.llama import Context, ContextOptions, Model, ModelOptions, SeqView, decode_views
from localflash.speculative.dflash import DFlashDrafter, DFlashGroup
from localflash.speculative.draft_model import DraftModelDrafter, DraftModelGroup
from localflash.speculative.mtp import MtpDrafter, MtpGroup
from localflash.testing.tiny import DFlash2Spec, DFlashSpec, HybridSpec, TinySpec, write_dflash, write_dflash2, write_hybrid, write_target

N_SEQ = 4
N_CTX = 256  # per slot
WORDS = "the clam river stone quiet light north seven garden market paper window cold bright".split()


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target)


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def drafter_file(request, tiny_dir):
    if request.param == "dflash":
        return write_dflash(tiny_dir / "group-dflash.gguf", DFlashSpec(target_layers=[1, 2, 3], block_size=8))
    return write_dflash2(tiny_dir / "group-dflash2.gguf", DFlash2Spec(target_layers=[1, 2, 3]))


def _prompts(target, texts):
    return [target.tokenize(t) for t in texts]


TEXTS = ["the clam river stone quiet light", "north seven garden market paper window",
         "cold bright window light river stone", "seven garden the clam north paper"]


def _group(target, drafter_file, prompts, in_graph: bool = False):
    """A 4-sequence target context with each prompt prefilled on its sequence (one decode), and a DFlashGroup fed it."""
    ctx = Context(target, ContextOptions(n_ctx=N_CTX * N_SEQ, n_seq_max=N_SEQ, kv_unified=False, n_outputs_max=64, n_threads=1))
    views = [SeqView(ctx, i) for i in range(N_SEQ)]
    group = DFlashGroup(Model(drafter_file), target, ctx, N_CTX + 16, N_SEQ, n_threads=1, in_graph_argmax=in_graph)
    assert group.in_graph == in_graph
    decode_views(ctx, [(v, p, 0, "last") for v, p in zip(views, prompts)])
    group.on_target_decode([(i, v, 0, len(p)) for i, (v, p) in enumerate(zip(views, prompts))])
    return ctx, group


def _asks(prompts, k):
    return [(i, p + [p[0]], len(p), k) for i, p in enumerate(prompts)]


def _rows(drafter):
    """Slot ``drafter``'s rows of the group's last draft decode: its block's logits (DFlash) or lattice (DFlash2)."""
    return (drafter.ctx.nextn_rows(drafter.block_size) if drafter.top_k else drafter.ctx.all_logits()).copy()


def test_group_drafts_equal_each_slots_drafts_from_a_drafter_of_its_own(target, drafter_file):
    prompts = _prompts(target, TEXTS)
    ctx, group = _group(target, drafter_file, prompts)
    k = group.max_draft
    together = group.propose(_asks(prompts, k))
    assert group.ctx.n_decodes == 2  # one intake of all four prompts' features, one draft decode of all four blocks
    rows = [_rows(d) for d in group.drafters]
    alone, alone_rows = [], []
    for p in prompts:
        tctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=16, n_threads=1))
        solo = DFlashDrafter(Model(drafter_file), target, tctx, N_CTX + 16, n_threads=1, in_graph_argmax=False)
        tctx.decode(p, 0, "last")
        solo.on_target_decode(tctx, 0, len(p))
        alone.append(solo.propose(p + [p[0]], len(p), k))
        alone_rows.append(_rows(solo))
        solo.close()
        tctx.close()
    assert together == alone
    for a, b in zip(rows, alone_rows):  # F32 kernels may round a 32-row batch and an 8-row one differently, in the last bits
        assert np.abs(a - b).max() < 1e-3 * max(1.0, np.abs(b).max())
    assert all(len(d) == k for d in together) or group.drafters[0].top_k  # DFlash1 drafts the whole block
    for d, p in zip(group.drafters, prompts):
        assert d.ctx.pos_max() == len(p) - 1  # every noise block cut from its own sequence, the features kept
    group.close()
    ctx.close()


def test_group_drafts_argmaxed_in_the_graph_equal_the_drafts_numpy_reads(target, tiny_dir):
    """A greedy chain on every sequence of the shared context (what a GPU build uses): each slot's ids are its rows' argmax.
    DFlash1 only: DFlash2 drafts from its selector lattice, never from sampled ids."""
    drafter_file = write_dflash(tiny_dir / "group-dflash-in-graph.gguf", DFlashSpec(target_layers=[1, 2, 3], block_size=8))
    prompts = _prompts(target, TEXTS)
    runs = []
    for in_graph in (False, True):
        ctx, group = _group(target, drafter_file, prompts, in_graph)
        runs.append(group.propose(_asks(prompts, group.max_draft)))
        group.close()
        ctx.close()
    assert runs[1] == runs[0] and all(len(d) == group.max_draft for d in runs[1])


def test_a_slots_draft_rows_do_not_change_with_another_slots_content(target, drafter_file):
    prompts = _prompts(target, TEXTS)
    other = target.tokenize("paper paper cold cold seven seven")
    assert len(other) == len(prompts[1])  # the same cells in use: only what slot 1 holds differs
    runs = []
    for p1 in (prompts[1], other):
        ps = [prompts[0], p1, prompts[2], prompts[3]]
        ctx, group = _group(target, drafter_file, ps)
        group.propose(_asks(ps, group.max_draft))
        runs.append([_rows(d) for d in group.drafters])
        group.close()
        ctx.close()
    for i in (0, 2, 3):
        assert np.array_equal(runs[0][i], runs[1][i])  # bit for bit
    assert not np.allclose(runs[0][1], runs[1][1])  # slot 1 itself does see its new content


def _pool_steps(drafter_file, tiny_target, parallel: int, spec: str = "dflash", draft_max=None, max_tokens: int = 24) -> list[tuple[int, int, int]]:
    """(active slots, decodes on the shared drafter context, draft tokens) of every step of ``parallel`` requests at once."""
    with load(model=str(tiny_target), drafter=str(drafter_file) if drafter_file else None, spec=spec, threads=1, ctx=N_CTX * parallel,
              fixed=True, draft_max=4, parallel=parallel) as llm:
        pool = llm.pool
        dctx = pool.group.ctx
        log = []
        step = pool._step

        def counted(active, filling=()):
            n0, rows0 = dctx.n_decodes, pool.rows_decoded
            step(active, filling)
            if not filling:  # a step that also carries a joining prompt's chunk: its intake is that slot's own
                log.append((len(active), dctx.n_decodes - n0, pool.rows_decoded - rows0 - len(active)))

        pool._step = counted
        threads = [threading.Thread(target=lambda i=i: llm.start(TEXTS[i % len(TEXTS)], raw=True, max_tokens=max_tokens, slot=i,
                                                                 draft_max=draft_max).completion())
                   for i in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return log


def test_a_pool_step_costs_the_drafter_one_intake_and_one_draft_decode_for_all_slots(drafter_file, tiny_target):
    log = _pool_steps(drafter_file, tiny_target, N_SEQ)
    assert any(n == N_SEQ and drafted for n, _decodes, drafted in log)  # steps with every slot drafting
    for n, decodes, drafted in log:
        # a drafting step: the draft decode and the intake decode, plus one decode for every slot's held rows
        # (a prompt's last rows, held until its first draft); a step without drafts: its rows held, or one intake
        assert decodes in ((2, 3) if drafted else (0, 1)), (n, decodes, drafted)
    assert sum(d == 3 for _n, d, _dr in log) <= N_SEQ  # held rows go in before a request's first draft only


def test_plain_steps_cost_a_dflash_pool_no_drafter_decode_until_a_slots_hold_is_full(drafter_file, tiny_target):
    """Requests that draft nothing (draft_max 0, as the step policy's k = 0): their rows wait on the host and go in
    one decode per HOLD_ROWS rows of a slot (all full slots together), not one decode per step."""
    from localflash.speculative.dflash import HOLD_ROWS

    log = _pool_steps(drafter_file, tiny_target, N_SEQ, draft_max=0, max_tokens=2 * HOLD_ROWS)
    assert len(log) >= HOLD_ROWS and not any(drafted for _n, _d, drafted in log)
    intakes = sum(d for _n, d, _dr in log)
    assert 1 <= intakes <= 3 * N_SEQ, (intakes, len(log))  # ~140 rows a slot: two full holds, at worst apart


@pytest.fixture(scope="module", params=["llama", "qwen35"])
def draft_pair(request, tiny_dir, tiny_target, tiny_qwen35):
    """(target file, draft model file): a llama draft model, and a hybrid one (recurrent state cut back by checkpoints)."""
    if request.param == "llama":
        return tiny_target, write_target(tiny_dir / "group-draft.gguf", TinySpec(n_layer=4, seed=0, noise=0.1))
    return tiny_qwen35, write_hybrid(tiny_dir / "group-q35-draft.gguf", HybridSpec(seed=3, noise=0.1))


def test_draft_model_group_drafts_what_each_slots_own_draft_model_drafts_cycle_after_cycle(draft_pair):
    """Six cycles of four slots, each accepting a different number of drafts (rejected ones cut from its cache,
    a hybrid drafter's state restored from its checkpoint and replayed) and then its own bonus token."""
    target_file, draft_file = draft_pair
    target = Model(target_file)
    model = Model(draft_file)
    group = DraftModelGroup(model, target, N_CTX, N_SEQ, max_draft=4)
    solos = [DraftModelDrafter(Model(draft_file), target, N_CTX, 4, n_threads=1) for _ in range(N_SEQ)]
    histories = [p + [p[0]] for p in _prompts(target, TEXTS)]
    for i, (d, h) in enumerate(zip(group.drafters, histories)):
        d.on_prompt(h[:-1])
        solos[i].on_prompt(h[:-1])
    n0 = group.ctx.n_decodes
    for cycle in range(6):
        asks = [(i, h, len(h) - 1, 4) for i, h in enumerate(histories)]
        together = group.propose(asks)
        alone = [solo.propose(h, len(h) - 1, 4) for solo, h in zip(solos, histories)]
        assert together == alone, cycle
        assert all(len(d) == 4 for d in together)
        for i, (h, draft) in enumerate(zip(histories, together)):
            kept = (cycle + i) % 5  # 0..4 drafts accepted, then a token of the target's own
            h += draft[:kept] + [WORDS_IDS[(cycle + i) % len(WORDS_IDS)]]
    assert group.ctx.n_decodes - n0 == 6 * 4  # per cycle: one catch-up of all four slots, then one decode per draft position
    group.close()
    for solo in solos:
        solo.close()


WORDS_IDS = [3, 7, 11, 19, 23]  # bonus tokens: ordinary ids of the tiny SPM vocabulary


def test_a_pool_step_costs_the_draft_model_one_catch_up_and_one_decode_per_draft_position(draft_pair):
    target_file, draft_file = draft_pair
    log = _pool_steps(draft_file, target_file, N_SEQ, spec="draft")
    assert any(n == N_SEQ and drafted == 4 * N_SEQ for n, _decodes, drafted in log)
    for n, decodes, drafted in log:
        if drafted == 4 * n:  # every slot drafted 4 tokens: its catch-up and 3 more rows, in 4 decodes for all of them
            assert decodes == 4, (n, decodes, drafted)
        assert decodes <= 4


def test_mtp_group_drafts_what_each_slots_own_mtp_drafter_drafts(tiny_qwen35_mtp_agree):
    """Four slots' MTP drafts (3 tokens each, every one fed the MTP block's own hidden state) in 3 decodes for all."""
    target = Model(tiny_qwen35_mtp_agree, ModelOptions(load_mtp=True))
    prompts = _prompts(target, TEXTS)
    ctx = Context(target, ContextOptions(n_ctx=N_CTX * N_SEQ, n_seq_max=N_SEQ, kv_unified=False, n_outputs_max=16, n_threads=1))
    views = [SeqView(ctx, i) for i in range(N_SEQ)]
    group = MtpGroup(target, ctx, N_CTX, N_SEQ, max_draft=3)
    for i, (v, p) in enumerate(zip(views, prompts)):  # a hybrid target: each prompt alone, as the slot pool prefills
        v.decode(p, 0, "last")
        group.on_target_decode([(i, v, 0, len(p))])
    n0 = group.ctx.n_decodes
    together = group.propose(_asks(prompts, 3))
    assert group.ctx.n_decodes - n0 == 3
    alone = []
    for p in prompts:
        tctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=16, n_threads=1))
        solo = MtpDrafter(target, tctx, N_CTX, 3, n_threads=1)
        tctx.decode(p, 0, "last")
        solo.on_target_decode(tctx, 0, len(p))
        alone.append(solo.propose(p + [p[0]], len(p), 3))
        solo.close()
        tctx.close()
    assert together == alone and all(len(d) == 3 for d in together)
    for d, p in zip(group.drafters, prompts):
        assert d.ctx.pos_max() == len(p) - 1  # the draft steps cut from each sequence, the fed prompt kept
    group.close()
    ctx.close()


def test_a_pool_step_costs_mtp_one_intake_and_one_decode_per_draft_position(tiny_qwen35_mtp_agree):
    log = _pool_steps(None, tiny_qwen35_mtp_agree, N_SEQ, spec="mtp")
    assert any(n == N_SEQ and drafted == 4 * N_SEQ for n, _decodes, drafted in log)
    for n, decodes, drafted in log:
        if drafted == 4 * n:  # every slot drafted 4 tokens: the intake, then 4 draft positions, for all of them
            assert decodes == 5, (n, decodes, drafted)
        assert decodes <= 5 and decodes >= 1 + (drafted > 0)
