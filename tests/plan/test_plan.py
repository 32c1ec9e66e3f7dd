"""The VRAM planner: its cost model against llama.cpp's own accounting, then pinned real-shaped plans."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from localflash.plan.devices import Gpu, HostMemory, host_memory, parse_size, select_gpus
from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import read_meta
from localflash.llama.accounting import measure
from localflash.plan.costs import GiB, MiB, compute_bytes, kv_bytes_per_layer, recurrent_bytes_per_layer
from localflash.plan.fit import context_for_total, make_plan, runtime_kwargs
from localflash.plan.pricer import Placement, Pricer
from localflash.plan.types import Wishes
from localflash.testing.shaped import PRESETS, ModelSpec, write_preset, write_shaped
from localflash.testing.tiny import TinySpec, write_target

HOST = HostMemory(64 * GiB, 60 * GiB)
# llama.cpp's own settings for the single-card DFlash report (PR #22105): the draft inherits the
# context with an f16 cache, and llama-server keeps n_max = 3 recurrent snapshots for DFlash
LLAMA_CPP_LIKE = dict(drafter_ctx_cap=None, drafter_kv="f16", n_draft=3)


def card(gib: float, i: int = 0) -> Gpu:
    return Gpu(i, "RTX 3090", int(gib * GiB), int(gib * GiB))


# --- accuracy against llama.cpp's accounting -----------------------------------------------


def _compare(meta, path, *, n_ctx, kv, ubatch, fa, n_out, no_alloc=False, n_rs_seq=0):
    acc = measure(path, n_ctx=n_ctx, n_batch=512, n_ubatch=ubatch, type_k=kv, type_v=kv, flash_attn=fa,
                  n_outputs_max=n_out, n_rs_seq=n_rs_seq, no_alloc=no_alloc)
    layers = list(range(meta.n_layer_all))
    planned = {
        "model": meta.weight_bytes,
        "kv": sum(kv_bytes_per_layer(meta, n_ctx, kv, ubatch).values()),
        "recurrent": sum(recurrent_bytes_per_layer(meta, n_rs_seq).values()),
        "compute": compute_bytes(meta, layers, True, n_ctx=n_ctx, n_ubatch=ubatch, n_outputs=n_out or 512,
                                 kv=kv, flash_attn=fa),
    }
    return planned, {k: acc.total(k) for k in planned}


SMOLLM2_CONFIGS = [  # n_ctx, KV type, n_ubatch, flash attention, n_outputs_max (0: n_batch)
    (512, "f16", 512, True, 0),
    (2048, "q8_0", 512, True, 1),
    (8192, "q4_0", 512, True, 9),
    (4096, "f16", 128, True, 9),
    (8192, "f16", 512, False, 9),
    (2048, "f16", 256, True, 0),
    (4096, "q8_0", 64, True, 16),
]


@pytest.fixture(scope="module")
def smol_meta(smollm2):
    return read_meta(smollm2)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-plan")
    spec = dict(n_embd=256, n_layer=2, n_head=8, n_head_kv=2, n_ff=768)
    return {arch: write_target(d / f"{arch}.gguf", TinySpec(arch=arch, **spec)) for arch in ("llama", "qwen3")}


@pytest.mark.parametrize("n_ctx,kv,ubatch,fa,n_out", SMOLLM2_CONFIGS)
def test_smollm2_matches_llama_cpp(smollm2, smol_meta, n_ctx, kv, ubatch, fa, n_out):
    planned, actual = _compare(smol_meta, smollm2, n_ctx=n_ctx, kv=kv, ubatch=ubatch, fa=fa, n_out=n_out)
    assert planned["model"] == pytest.approx(actual["model"], rel=0.03)
    assert planned["kv"] == pytest.approx(actual["kv"], rel=0.03)
    assert planned["compute"] == pytest.approx(actual["compute"], rel=0.10)


@pytest.mark.parametrize("arch,n_ctx,ubatch,fa,n_out", [
    ("llama", 4096, 512, True, 1),
    ("llama", 1024, 512, False, 1),
    ("qwen3", 2048, 128, True, 0),
])
def test_tiny_models_match_llama_cpp(tiny_models, arch, n_ctx, ubatch, fa, n_out):
    path = tiny_models[arch]
    planned, actual = _compare(read_meta(path), path, n_ctx=n_ctx, kv="f16", ubatch=ubatch, fa=fa, n_out=n_out)
    assert planned["model"] == pytest.approx(actual["model"], rel=0.03)
    assert planned["kv"] == pytest.approx(actual["kv"], rel=0.03)
    assert planned["compute"] == pytest.approx(actual["compute"], rel=0.10)


@pytest.mark.parametrize("preset,ftype,n_ctx,kv,n_rs_seq", [
    ("qwen3.6-27b", "Q4_K_M", 32768, "q8_0", 8),  # hybrid: recurrent state and the 16 attention blocks
    ("qwen3-30b-a3b", "Q4_K_M", 4096, "f16", 0),  # MoE expert stage
])
def test_real_shapes_match_a_llama_cpp_dry_run(tmp_path, preset, ftype, n_ctx, kv, n_rs_seq):
    """``no_alloc`` load of a shaped file: llama.cpp sizes the graph and allocates nothing.

    The placeholder vocabulary is cut to 32000 pieces to keep the test fast; it changes only the
    embedding and head rows, not the block shapes the compute buffer depends on."""
    spec = replace(PRESETS[preset], n_vocab=32000)
    path = write_shaped(tmp_path / "dry.gguf", spec, ftype, tokenizer=True)
    planned, actual = _compare(read_meta(path), path, n_ctx=n_ctx, kv=kv, ubatch=512, fa=True, n_out=9,
                               no_alloc=True, n_rs_seq=n_rs_seq)
    assert planned["compute"] == pytest.approx(actual["compute"], rel=0.10)
    assert planned["recurrent"] == pytest.approx(actual["recurrent"], rel=0.03)


def test_layer_placement_follows_llama_cpp_rule(shaped):
    """Block slot -> GPU with llama.cpp's float upper_bound over the normalised cumulative split."""
    t = shaped["32b"]
    pr = Pricer(t, None, [card(24), card(24, 1), card(24, 2)], HOST, Wishes())
    n_slots = t.n_layer_all + 1
    for slots, ngl in [((38, 27), 65), ((20, 25, 20), 65), ((30, 10), 40)]:
        gpus = tuple(range(len(slots)))
        where = pr.slot_devices(Placement(gpus, slots, ngl))
        cum = [sum(slots[: i + 1]) / sum(slots) for i in range(len(slots))]
        start = n_slots - ngl
        for il in range(n_slots):
            expected = None if il < start else next(g for g, c in enumerate(cum) if c > (il - start) / ngl)
            assert where[il] == expected


# --- real-shaped plans (numbers pinned) ----------------------------------------------------------


def test_qwen36_27b_dflash_fits_one_24gb_card(shaped):
    plan = make_plan(shaped["27b"], shaped["dflash"], [card(24)], HOST, Wishes())
    gpu = plan.devices[0]
    assert plan.n_gpu_layers == 66 and plan.split_mode == "none" and plan.drafter_device == 0
    assert (plan.n_ctx, plan.type_k, plan.n_rs_seq) == (32768, "f16", 8)
    assert gpu.free > 0 and gpu.used == pytest.approx(20.02 * GiB, rel=0.005)
    assert gpu.target_weights == pytest.approx(14.73 * GiB, rel=0.002)  # token embedding stays on the host
    assert plan.context_options == {"f16": 89088, "q8_0": 150784, "q4_0": 257792}


def test_qwen36_27b_131k_q8_matches_the_upstream_report(shaped):
    """PR #22105: unsloth Q4_K_M + IQ4_XS DFlash draft, 131072 context, q8_0 KV: 23.3 GB (21 GB without the draft)."""
    wishes = Wishes(ctx=131072, kv="q8_0", **LLAMA_CPP_LIKE)
    plan = make_plan(shaped["27b"], shaped["dflash-iq4"], [card(24)], HOST, wishes)
    assert plan.n_ctx == 131072 and plan.drafter_n_ctx == 131072 and plan.n_rs_seq == 3
    assert plan.devices[0].used == pytest.approx(23.3e9, rel=0.05)
    assert plan.devices[0].used == pytest.approx(24.09e9, rel=0.005)
    base = make_plan(shaped["27b"], None, [card(24)], HOST, Wishes(ctx=131072, kv="q8_0", n_rs_seq=0))
    assert base.devices[0].used == pytest.approx(21e9, rel=0.05)
    # localflash's own defaults cap the drafter's context instead of letting it inherit 131072
    ours = make_plan(shaped["27b"], shaped["dflash-iq4"], [card(24)], HOST, Wishes(ctx=131072))
    assert ours.type_k == "q8_0" and ours.drafter_n_ctx == 32768 and ours.devices[0].free > 0
    assert any(c.setting == "drafter_n_ctx" for c in ours.changes)


def test_context_of_the_quoted_22_3_gb_setup(shaped):
    """16.8 GB target + 1.03 GB drafter = 22.3 GB on the card: which context is that?"""
    t, d = shaped["27b"], shaped["dflash"]
    assert context_for_total(t, d, int(22.3e9), "q8_0", Wishes(**LLAMA_CPP_LIKE)) == 89088
    assert context_for_total(t, d, int(22.3e9), "f16", Wishes(**LLAMA_CPP_LIKE)) == 55040


def test_qwen3_32b_with_0_6b_on_two_cards(shaped):
    plan = make_plan(shaped["32b"], shaped["0.6b"], [card(24), card(24, 1)], HOST, Wishes(ctx=32768))
    a, b = plan.devices
    assert plan.split_mode == "layer" and plan.tensor_split == [38.0, 27.0]
    assert plan.type_k == "f16" and plan.n_gpu_layers == 65
    assert plan.drafter_device == 1 and b.drafter_weights > 0 and a.drafter_weights == 0
    assert b.layers.endswith("output")  # the drafter sits with the output layer
    assert abs(a.free - b.free) < 0.25 * GiB  # split by bytes, not by layer count
    assert a.used == pytest.approx(15.90 * GiB, rel=0.005)
    kw = runtime_kwargs(plan)
    assert kw["split_mode"] == 1 and kw["tensor_split"] == [38.0, 27.0] and kw["drafter"]["main_gpu"] == 1


def test_one_card_is_recommended_when_the_pair_fits_on_it(shaped):
    plan = make_plan(shaped["32b"], shaped["0.6b"], [card(24), card(24, 1)], HOST, Wishes(ctx=8192))
    assert plan.split_mode == "none" and plan.tensor_split is None and len(plan.devices) == 1
    assert any(c.setting == "split_mode" and "no faster" in c.reason for c in plan.changes)


def test_tensor_split_only_when_asked(shaped):
    two = [card(24), card(24, 1)]
    plan = make_plan(shaped["32b"], None, two, HOST, Wishes(ctx=32768, split="tensor"))
    assert plan.split_mode == "tensor" and plan.tensor_split == [0.5, 0.5] and plan.type_k == "f16"
    assert plan.devices[0].target_weights == pytest.approx(plan.devices[1].target_weights, rel=0.1)
    assert any("experimental" in w for w in plan.warnings)
    with pytest.raises(LocalflashError, match="f16/bf16/f32 KV"):
        make_plan(shaped["32b"], None, two, HOST, Wishes(kv="q8_0", split="tensor"))
    with pytest.raises(LocalflashError, match="row"):
        make_plan(shaped["32b"], None, two, HOST, Wishes(split="row"))


def test_moe_experts_on_host_for_a_12gb_card(shaped):
    plan = make_plan(shaped["moe"], None, [card(12)], HOST, Wishes(ctx=16384))
    assert plan.n_gpu_layers == 49  # every block on the GPU; only expert tensors stay on the host
    (pattern, buf), = plan.tensor_overrides
    assert buf == "CPU" and "ffn_(up|down|gate|gate_up)_exps" in pattern
    assert pattern.startswith(r"^blk\.(0|1|") and r"|19)\." in pattern  # experts of blocks 0-19
    assert plan.devices[0].free >= 0 and plan.host.target_weights == pytest.approx(6.97 * GiB, rel=0.01)
    assert 1 < plan.slowdown < 10
    assert runtime_kwargs(plan)["tensor_buft_overrides"] == [(pattern, "CPU")]


def test_partial_offload_states_the_slowdown(shaped):
    plan = make_plan(shaped["32b"], None, [card(20)], HOST, Wishes(ctx=40960, kv="f16"))
    assert plan.n_gpu_layers == 43
    change = next(c for c in plan.changes if c.setting == "n_gpu_layers")
    assert "22 blocks" in change.reason and "slower" in change.reason


def test_runtime_kwargs_keys(shaped):
    plan = make_plan(shaped["27b"], shaped["dflash"], [card(24)], HOST, Wishes())
    kw = runtime_kwargs(plan)
    assert set(kw) == {"n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "tensor_buft_overrides", "n_ctx",
                       "n_batch", "n_ubatch", "n_outputs_max", "n_rs_seq", "type_k", "type_v", "flash_attn",
                       "drafter_n_ctx", "drafter", "load_mtp", "devices"}
    assert (kw["type_k"], kw["flash_attn"], kw["n_outputs_max"], kw["drafter_n_ctx"], kw["load_mtp"]) == (1, True, 9, 32768, False)
    assert json.loads(plan.to_json())["devices"][0]["used"] == plan.devices[0].used


# --- bad input -----------------------------------------------------------------------------------


def test_budget_too_small_names_the_minimum(shaped):
    with pytest.raises(LocalflashError) as e:
        make_plan(shaped["32b"], None, [card(0.1)], HOST, Wishes())
    assert "smallest configuration" in e.value.message and "needs 1.71 GiB on the card" in e.value.message


def test_explicit_context_too_big_lists_what_fits(shaped):
    with pytest.raises(LocalflashError) as e:
        make_plan(shaped["27b"], shaped["dflash"], [card(24)], HostMemory(16 * GiB, 8 * GiB), Wishes(ctx=262144, kv="f16"))
    assert e.value.hint == "largest context that fits: 89088 with f16 KV (--ctx 89088 --kv f16)"


def test_unknown_arch_is_planned_with_a_warning(tmp_path):
    spec = ModelSpec("mystery", "Mystery-7B", n_layer=32, n_embd=4096, n_ff=11008, n_head=32, n_head_kv=8,
                     head_dim=128, n_vocab=32000, n_ctx_train=8192)
    meta = read_meta(write_shaped(tmp_path / "m.gguf", spec, "Q4_K_M"))
    plan = make_plan(meta, None, [card(12)], HOST, Wishes(ctx=8192))
    assert plan.n_gpu_layers == 33 and any("unknown architecture" in w for w in plan.warnings)
    assert plan.devices[0].target_kv == 32 * 8192 * 2 * 1024 * 2  # from attn_k/attn_v shapes


def test_more_gpus_than_exist_is_an_error():
    one = [Gpu(0, "RTX 3090", 24 * GiB, 23 * GiB)]
    with pytest.raises(LocalflashError, match="this machine has 1 GPU"):
        select_gpus(one, gpus="24GiB,24GiB")
    with pytest.raises(LocalflashError, match="asks for GPU 1"):
        select_gpus(one, gpus="0,1")
    with pytest.raises(LocalflashError, match="asks for GPU 0"):
        select_gpus([], gpus="0")
    assert [g.total for g in select_gpus([], gpus="24GiB,12GiB")] == [24 * GiB, 12 * GiB]  # another rig
    assert select_gpus(one, vram="20GiB")[0].free == 20 * GiB


def test_cpu_only_plans_host_ram(smol_meta):
    plan = make_plan(smol_meta, None, [], HostMemory(8 * GiB, 4 * GiB), Wishes(ctx=4096))
    assert plan.devices == [] and plan.n_gpu_layers == 0 and plan.slowdown == 1.0
    assert plan.host.used == pytest.approx(96_576_768 + 94_371_840 + 18.4 * MiB, rel=0.02)


def test_sizes_and_meminfo(tmp_path):
    assert parse_size("24GiB") == 24 * GiB and parse_size("22.3GB") == 22_300_000_000 and parse_size("512MiB") == 512 * MiB
    with pytest.raises(LocalflashError, match="not a memory size"):
        parse_size("lots")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert host_memory(meminfo) == HostMemory(32000000 * 1024, 20000000 * 1024)


def test_plan_command_json(shaped, tmp_path, capsys):
    from rich.console import Console

    from localflash.cli.plan import plan_command

    t = write_preset(tmp_path, "qwen3.6-27b", "Q4_K_M")
    d = write_preset(tmp_path, "qwen3.6-27b-dflash", "Q4_K_M")
    plan_command(target=str(t), drafter=str(d), vram="24GiB", json_out=True, console=Console(), detected=[], host=HOST)
    doc = json.loads(capsys.readouterr().out)
    assert doc["runtime_kwargs"]["n_gpu_layers"] == 66 and doc["devices"][0]["budget"] == 24 * GiB - 512 * MiB


def test_context_suggestions_stop_at_the_trained_context(lf, smollm2, shaped):
    r = lf("run", "-m", smollm2, "-c", "99999999", "-t", "1", "hi")  # an 8K-token model
    assert r.returncode == 1 and "Traceback" not in r.stderr
    hint = next(ln for ln in r.stderr.splitlines() if ln.startswith("hint:"))
    assert "largest context that fits: 8192 with f16 KV (--ctx 8192 --kv f16), all the model was trained on" in hint
    assert "more than its trained 8192 tokens needs RoPE scaling" in hint
    with pytest.raises(LocalflashError) as e:
        make_plan(shaped["32b"], None, [card(24)], HOST, Wishes(ctx=10**8, kv="f16"))
    n = int(e.value.hint.split("--ctx ")[1].split()[0])
    assert 0 < n <= shaped["32b"].n_ctx_train and "RoPE scaling" in e.value.hint
