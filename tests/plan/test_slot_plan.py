"""`plan --parallel N` prices the drafter as open_engine builds it for N slots (plan/pricer.py: drafter_layout).

DFlash and a draft model: one drafter context of N sequences, each the slot's share of the
target's context (DFlash: + its block's room), so the KV is N shares and one compute buffer
outputs every slot's rows; EAGLE-3: N contexts, N caches and N compute buffers; MTP: one MTP
context of N shares. Each priced figure is checked against the cost formulas at that layout, at
a context where the drafter's 32k cap binds a single slot but not a slot's share (so a plan
that ignored N would price a different, smaller cache), and the layout against the contexts a
real pool of tiny models opens.
"""

from __future__ import annotations

import pytest

from localflash.archs import BLOCK_ROOM
from localflash.formats.gguf_meta import read_meta
from localflash.plan.costs import GiB, compute_bytes, kv_bytes_per_layer, pad_ctx
from localflash.plan.devices import Gpu, HostMemory
from localflash.plan.fit import make_plan
from localflash.plan.types import Wishes
from localflash.testing.tiny import Eagle3Spec, write_eagle3

HOST = HostMemory(256 * GiB, 250 * GiB)
CARD = Gpu(0, "H200", 140 * GiB, 140 * GiB)
N_CTX = 131072  # one slot: the drafter capped at 32768; 8 slots: 16384 each


def _kv(meta, cells: int) -> int:
    return sum(kv_bytes_per_layer(meta, cells, "f16", 512).values())


def _compute(meta, cells: int, outputs: int) -> int:
    return compute_bytes(meta, list(range(meta.n_layer)), True, n_ctx=cells, n_ubatch=512, n_outputs=outputs, kv="f16", cuda=True)


def _plan(target, drafter, n_seq: int, **kw):
    return make_plan(target, drafter, [CARD], HOST, Wishes(ctx=N_CTX, kv="f16", drafter_kv="f16", n_seq=n_seq, **kw))


def test_dflash_slots_share_one_context_of_n_shares(shaped):
    one, eight = _plan(shaped["27b"], shaped["dflash"], 1), _plan(shaped["27b"], shaped["dflash"], 8)
    d = shaped["dflash"]
    cells = 8 * (N_CTX // 8 + BLOCK_ROOM)
    assert eight.drafter_slots == {"contexts": 1, "seqs": 8, "positions": N_CTX // 8 + BLOCK_ROOM}
    assert eight.devices[0].drafter_kv == _kv(d, cells)
    assert eight.devices[0].drafter_compute == _compute(d, cells, min(512, 8 * d.block_size))
    assert one.drafter_slots is None and one.devices[0].drafter_kv == _kv(d, 32768)
    assert eight.devices[0].drafter_kv > 3 * one.devices[0].drafter_kv  # 8 x 16k positions, not one 32k cache (SWA blocks stay at the window)


def test_a_draft_model_s_slots_share_one_context_with_a_row_a_slot(shaped):
    four = _plan(shaped["32b"], shaped["0.6b"], 4)
    d = shaped["0.6b"]
    assert four.drafter_slots == {"contexts": 1, "seqs": 4, "positions": N_CTX // 4}
    assert four.devices[0].drafter_kv == _kv(d, N_CTX)
    assert four.devices[0].drafter_compute == _compute(d, N_CTX, 4)


def test_eagle3_slots_each_get_a_context(tiny_dir, tiny_target):
    e3 = read_meta(write_eagle3(tiny_dir / "plan-eagle3.gguf", Eagle3Spec()))
    t = read_meta(tiny_target)
    one, six = _plan(t, e3, 1, n_draft=8), _plan(t, e3, 6, n_draft=8)
    share = min(32768, pad_ctx(N_CTX) // 6) + 8 + 1
    assert six.drafter_slots == {"contexts": 6, "seqs": 1, "positions": share}
    assert six.devices[0].drafter_kv == 6 * _kv(e3, share)
    assert six.devices[0].drafter_compute == 6 * _compute(e3, share, 1)
    assert six.devices[0].drafter_kv != one.devices[0].drafter_kv


def test_mtp_slots_share_one_context_with_a_row_a_slot(tiny_qwen35_mtp):
    meta = read_meta(tiny_qwen35_mtp)
    one = make_plan(meta, None, [CARD], HOST, Wishes(ctx=8192, kv="f16", n_draft=3, mtp=True))
    four = make_plan(meta, None, [CARD], HOST, Wishes(ctx=8192, kv="f16", n_draft=3, mtp=True, n_seq=4))
    assert four.drafter_slots == {"contexts": 1, "seqs": 4, "positions": 2048}
    assert four.devices[0].drafter_kv == one.devices[0].drafter_kv  # 4 x 2048 positions: the target's context
    # host buffers: the MTP rows' logits and hidden states, a row a slot; the target's verify outputs, n_draft + 1 a slot
    assert four.host.overhead - one.host.overhead == (3 * (meta.output_vocab + meta.n_embd) + 3 * 4 * meta.output_vocab) * 4


@pytest.mark.parametrize("spec", ["dflash", "eagle3"])
def test_the_layout_priced_is_the_one_a_pool_opens(tiny_target, tiny_dflash, tiny_dir, spec):
    from localflash.api import load

    drafter = tiny_dflash if spec == "dflash" else write_eagle3(tiny_dir / "plan-pool-eagle3.gguf", Eagle3Spec())
    from localflash.serve import startup_screen

    with load(model=str(tiny_target), drafter=str(drafter), spec=spec, ctx=2048, parallel=4, threads=1) as llm:
        lay = llm.pool.plan.drafter_slots
        assert f"slots    drafter for 4 slots: {'one context of 4 sequences' if spec == 'dflash' else '4 contexts'}" in \
            startup_screen(llm, "127.0.0.1", 8080, None, 16)
        if spec == "dflash":
            opened = [llm.pool.group.ctx.n_ctx]
        else:
            opened = [d.ctx.n_ctx for d in llm.pool.group.drafters]
    assert len(opened) == lay["contexts"]
    assert all(n == pad_ctx(lay["seqs"] * lay["positions"]) or n == lay["seqs"] * lay["positions"] for n in opened), (opened, lay)


def test_plan_parallel_prints_the_drafter_s_share(shaped, capsys, tmp_path):
    from rich.console import Console

    from localflash.cli.plan import plan_command

    plan = plan_command(target=str(shaped["27b"].path), drafter=str(shaped["dflash"].path), vram="140GiB", ctx=N_CTX, kv="f16",
                        parallel=8, console=Console(width=200), detected=[], host=HOST)
    out = capsys.readouterr().out
    assert plan.drafter_slots["seqs"] == 8
    assert f"drafter for 8 slots: one context of 8 sequences x {N_CTX // 8 + BLOCK_ROOM} positions" in out
    assert f"slots: 8 share one KV pool of {plan.n_ctx} tokens" in out and f"a request may use up to {plan.n_ctx}" in out
