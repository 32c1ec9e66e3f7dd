"""The planner's price of MTP drafting against llama.cpp's own accounting, and the pinned Qwen3.6-27B plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localflash.plan.devices import Gpu, HostMemory
from localflash.formats.gguf_meta import read_meta
from localflash.llama.accounting import measure
from localflash.plan import Wishes, make_plan, runtime_kwargs
from localflash.plan.costs import GiB, recurrent_bytes_per_layer
from localflash.plan.mtp import mtp_compute_bytes, mtp_kv_bytes, mtp_weight_bytes
from localflash.testing.shaped import PRESETS, write_preset, write_shaped

HOST = HostMemory(64 * GiB, 60 * GiB)
CARD = Gpu(0, "RTX 3090", 24 * GiB, 24 * GiB)


@pytest.mark.parametrize("n_ctx, kv, ubatch", [(4096, "f16", 512), (8192, "q8_0", 512), (2048, "f16", 128)])
def test_mtp_weights_kv_and_compute_match_llama_cpp(tiny_qwen35_mtp, n_ctx, kv, ubatch):
    meta = read_meta(tiny_qwen35_mtp)
    opts = dict(n_ctx=n_ctx, type_k=kv, type_v=kv, n_ubatch=ubatch, n_outputs_max=1)
    plain, with_mtp, mtp_ctx = (measure(tiny_qwen35_mtp, **opts, **extra) for extra in
                                ({}, {"load_mtp": True}, {"mtp_context": True}))
    assert mtp_weight_bytes(meta) == pytest.approx(with_mtp.total("model") - plain.total("model"), rel=0.03)
    assert mtp_kv_bytes(meta, n_ctx, kv, ubatch) == pytest.approx(mtp_ctx.total("kv"), rel=0.03)
    assert mtp_ctx.total("recurrent") == 0  # the MTP context caches the nextn block's attention only
    assert mtp_compute_bytes(meta, n_ctx, ubatch, kv, cuda=False) == pytest.approx(mtp_ctx.total("compute"), rel=0.10)


@pytest.mark.parametrize("n_ctx, kv", [(65536, "f16"), (262144, "f16"), (32768, "q8_0")])
def test_mtp_compute_at_real_shapes_matches_a_llama_cpp_dry_run(tmp_path_factory, n_ctx, kv):
    """A Qwen3.6-27B-shaped file (placeholder vocabulary of 32000): llama.cpp sizes the MTP graph, allocates nothing."""
    d = tmp_path_factory.mktemp("mtp-dry")
    path = write_shaped(d / "dry.gguf", replace(PRESETS["qwen3.6-27b"], n_vocab=32000), "Q4_K_M", tokenizer=True)
    acc = measure(path, n_ctx=n_ctx, type_k=kv, type_v=kv, n_outputs_max=1, mtp_context=True, no_alloc=True)
    assert mtp_compute_bytes(read_meta(path), n_ctx, 512, kv, cuda=False) == pytest.approx(acc.total("compute"), rel=0.10)


@pytest.fixture(scope="module")
def q36(tmp_path_factory):
    return write_preset(tmp_path_factory.mktemp("shaped-mtp"), "qwen3.6-27b", "Q4_K_M")


@pytest.fixture(scope="module")
def q36_short(tmp_path_factory):
    """Qwen3.6-27B's block shapes with a trunk of four blocks (three Gated-DeltaNet, one attention: a sixteenth of
    the real trunk's 64) and its MTP block; a placeholder vocabulary of 32000 (embedding and head only)."""
    spec = replace(PRESETS["qwen3.6-27b"], n_vocab=32000, n_layer=4)
    return write_shaped(tmp_path_factory.mktemp("shaped-mtp-short") / "short.gguf", spec, "Q4_K_M", tokenizer=True)


def test_qwen36_27b_q4_k_m_with_mtp_on_one_24gb_card(q36):
    """What `localflash plan --target Qwen3.6-27B-Q4_K_M.gguf --vram 24GiB --ctx 0` prices (MTP by default)."""
    meta = read_meta(q36)
    plan = make_plan(meta, None, [CARD], HOST, Wishes(ctx=0, n_draft=3, mtp=True))
    gpu = plan.devices[0]
    assert plan.mtp and runtime_kwargs(plan)["load_mtp"] and plan.n_rs_seq == 3
    assert plan.context_options == {"f16": 108544, "q8_0": 166144, "q4_0": 262144}  # largest context per KV type
    assert (plan.n_ctx, plan.type_k) == (262144, "q4_0") and gpu.free >= 0
    assert gpu.drafter_weights == pytest.approx(251 * 2**20, rel=0.01)  # the nextn block (llama.cpp's figure: below)
    without = make_plan(meta, None, [CARD], HOST, Wishes(ctx=0, n_draft=3))
    assert not without.mtp and without.context_options["f16"] > plan.context_options["f16"]


def test_qwen36_27b_mtp_plan_prices_what_llama_cpp_allocates_for_its_blocks(q36, q36_short):
    """The plan's drafter column and target KV against llama.cpp's own buffers for the same block shapes.

    llama.cpp loads the four-block file at 4096 cells (KV and weights really allocated, not mapped): what
    load_mtp adds to the model buffers is the MTP block's weights; the MTP context's KV cache and the target's
    KV + recurrent state (1 + n_rs_seq sequences) scale to the plan's 262144 cells and 16 times as many blocks.
    (Measured once against the full 64-block file at 4096 cells, mapped: the same KV and recurrent bytes.)"""
    plan = make_plan(read_meta(q36), None, [CARD], HOST, Wishes(ctx=0, n_draft=3, mtp=True))
    gpu, cells, copies = plan.devices[0], 4096, read_meta(q36).n_layer // read_meta(q36_short).n_layer
    kw = dict(n_ctx=cells, type_k=plan.type_k, type_v=plan.type_k, n_outputs_max=1, use_mmap=False)
    plain = measure(q36_short, **kw, n_rs_seq=plan.n_rs_seq)
    with_mtp = measure(q36_short, **kw, n_rs_seq=plan.n_rs_seq, load_mtp=True)
    mtp_ctx = measure(q36_short, **kw, mtp_context=True)
    assert copies == 16
    assert gpu.drafter_weights == pytest.approx(with_mtp.total("model") - plain.total("model"), rel=0.01)
    assert gpu.drafter_kv == pytest.approx(mtp_ctx.total("kv") * plan.n_ctx / cells, rel=0.01)
    assert mtp_ctx.total("recurrent") == 0
    target = copies * (plain.total("kv") * plan.n_ctx / cells + plain.total("recurrent"))
    assert gpu.target_kv == pytest.approx(target, rel=0.01)


def test_plan_command_prices_mtp_unless_told_not_to(q36, capsys):
    from rich.console import Console

    from localflash.cli.plan import plan_command

    console = Console(width=200)
    plan = plan_command(target=str(q36), vram="24GiB", ctx=0, console=console, detected=[], host=HOST)
    out = capsys.readouterr().out
    assert plan.mtp and "largest context that fits this placement: 108544 with f16, 166144 with q8_0, 262144 with q4_0" in out
    assert "the target's MTP block" in out
    assert not plan_command(target=str(q36), vram="24GiB", console=console, detected=[], host=HOST, mtp=False).mtp


def test_parallel_slots_price_a_recurrent_state_per_sequence(q36):
    """`plan --parallel 4`: the KV cache is shared (same context), the recurrent state is per sequence."""
    meta = read_meta(q36)
    one = make_plan(meta, None, [CARD], HOST, Wishes(ctx=32768, n_draft=3, mtp=True))
    four = make_plan(meta, None, [CARD], HOST, Wishes(ctx=32768, n_draft=3, mtp=True, n_seq=4))
    rs = sum(recurrent_bytes_per_layer(meta, 3).values())  # one sequence, 1 + n_rs_seq rows
    assert four.n_ctx == one.n_ctx and four.type_k == one.type_k
    assert four.devices[0].target_kv - one.devices[0].target_kv == 3 * rs
