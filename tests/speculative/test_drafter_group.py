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
from localflash.llama import Context, ContextOptions, Model, SeqView, decode_views
from localflash.speculative.dflash import DFlashDrafter, DFlashGroup
from localflash.testing.tiny import DFlash2Spec, DFlashSpec, write_dflash, write_dflash2

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


def _group(target, drafter_file, prompts):
    """A 4-sequence target context with each prompt prefilled on its sequence (one decode), and a DFlashGroup fed it."""
    ctx = Context(target, ContextOptions(n_ctx=N_CTX * N_SEQ, n_seq_max=N_SEQ, kv_unified=False, n_outputs_max=64, n_threads=1))
    views = [SeqView(ctx, i) for i in range(N_SEQ)]
    group = DFlashGroup(Model(drafter_file), target, ctx, N_CTX + 16, N_SEQ, n_threads=1)
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


def _pool_steps(drafter_file, tiny_target, parallel: int) -> list[tuple[int, int, int]]:
    """(active slots, decodes on the shared drafter context, draft tokens) of every step of ``parallel`` requests at once."""
    spec = "dflash"
    with load(model=str(tiny_target), drafter=str(drafter_file), spec=spec, threads=1, ctx=N_CTX * parallel,
              fixed=True, draft_max=4, parallel=parallel) as llm:
        pool = llm.pool
        dctx = pool.group.ctx
        log = []
        step = pool._step

        def counted(active):
            n0, rows0 = dctx.n_decodes, pool.rows_decoded
            step(active)
            log.append((len(active), dctx.n_decodes - n0, pool.rows_decoded - rows0 - len(active)))

        pool._step = counted
        threads = [threading.Thread(target=lambda i=i: llm.start(TEXTS[i % len(TEXTS)], raw=True, max_tokens=24, slot=i).completion())
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
        assert decodes == 1 + (drafted > 0), (n, decodes, drafted)
