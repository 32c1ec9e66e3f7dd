"""DFlash drafters across PyTorch, HF checkpoints and llama.cpp.

The central check: random weights written as an HF checkpoint, converted to
GGUF, run by llama.cpp with features tapped at the HF ids + 1, give the same
draft logits as the PyTorch module fed with the same features. A wrong tap,
mask token, window, norm or tensor name shows up as disagreement.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import torch  # noqa: E402  (the train extra; `make install` installs it)

from localflash import cli  # noqa: E402
from localflash.formats.dflash_gguf import DFlashSpec, read_dflash_gguf  # noqa: E402
from localflash.formats.dflash_hf import build_target_layer_ids, gguf_to_hf, hf_to_gguf, read_checkpoint, spec_from_hf  # noqa: E402
from localflash.formats.safetensors import write_safetensors  # noqa: E402
from localflash.errors import LocalflashError  # noqa: E402
from localflash.llama import Context, ContextOptions, Model  # noqa: E402
from localflash.speculative.dflash import DFlashDrafter  # noqa: E402
from localflash.testing.tiny import TinySpec, write_target  # noqa: E402
from localflash.train.export import export_hf  # noqa: E402
from localflash.train.model import DFlashDraft, target_matrices  # noqa: E402

MASK = 31999
TEXT = "The quick brown fox jumps over the lazy dog while seven silver birds sing. " * 8


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    """4-layer llama whose layers each change the residual a lot, so every tap gives different features."""
    return write_target(tmp_path_factory.mktemp("convert") / "target.gguf", TinySpec(n_layer=4, seed=0, layer_scale=0.25))


def random_drafter(target: Path, spec: DFlashSpec, draft_vocab: int = 0, seed: int = 0) -> DFlashDraft:
    """A drafter with random weights, norms included (all-ones norms would hide a swapped name)."""
    embed, head = target_matrices(target)
    d2t = None
    if draft_vocab:
        d2t = np.sort(np.random.default_rng(seed).choice(len(head), draft_vocab, replace=False))
        head = head[d2t]
    m = DFlashDraft(spec, torch.from_numpy(embed), torch.from_numpy(np.ascontiguousarray(head)),
                    torch.from_numpy(d2t) if d2t is not None else None)
    m.reset_parameters(std=0.1, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return m


def llama_vs_torch(target: Path, drafter_gguf: Path, model: DFlashDraft, hf_ids: list[int]) -> tuple[float, float]:
    """Argmax agreement and max relative error of draft logits over 7 blocks of 16."""
    tgt = Model(target)
    dm = Model(drafter_gguf)
    tctx = Context(tgt, ContextOptions(n_ctx=256, n_outputs_max=16))
    taps = [i + 1 for i in hf_ids]  # HF hidden_states[i + 1] = output of layer i = input of layer i + 1
    tctx.capture_layer_inputs(taps)
    dr = DFlashDrafter(dm, tgt, tctx, 256, in_graph_argmax=False)  # its logits are compared
    toks = tgt.tokenize(TEXT)[:80]
    feats, cpp, pos = [], {}, 0
    for n in (9, 20, 33, 41, 47, 60, 71):  # prefill in chunks, injecting as the engine does, drafting after each
        tctx.decode(toks[pos:n], pos, "last")
        feats.append(np.concatenate([tctx.layer_input(t, tctx.n_last)[: n - pos] for t in taps], 1).copy())
        dr.on_target_decode(tctx, pos, n - pos)
        dr.catch_up()  # rows held while not drafting (DFlashDrafter.intake) go in before the block decoded here
        pos = n
        dr.ctx.decode([toks[n]] + [dr.mask] * (dr.block_size - 1), n, "all")
        cpp[n] = dr.ctx.all_logits().copy()
        dr.ctx.seq_rm(n)
    dr.close()
    tctx.close()
    feats = np.concatenate(feats)
    agree = total = 0
    rel = 0.0
    for n, lc in cpp.items():
        lt = model.draft_logits(feats, [toks[n]] + [model.spec.mask_token_id] * (model.spec.block_size - 1), n)
        finite = np.isfinite(lt)
        assert np.array_equal(finite, np.isfinite(lc))  # same draft vocabulary
        agree += int((lt.argmax(1) == lc.argmax(1)).sum())
        total += len(lt)
        rel = max(rel, float(np.abs(lt[finite] - lc[finite]).max() / np.abs(lt[finite]).max()))
    return agree / total, rel


CASES = {
    "full-attention F32": (DFlashSpec(n_layer=2, n_head=4, n_head_kv=2, target_layers=[1, 3], mask_token_id=MASK), "F32", 0),
    "sliding F16": (DFlashSpec(n_layer=3, n_head=4, n_head_kv=2, target_layers=[1, 2, 3], mask_token_id=MASK, swa_window=6,
                               swa_layers=[True, False, True], causal=False, rope_theta=1e6), "F16", 0),
    "sliding causal, draft vocab F32": (DFlashSpec(n_layer=2, n_head=4, n_head_kv=1, target_layers=[2, 3], mask_token_id=MASK,
                                                   swa_window=5, swa_layers=[True, True], causal=True, embedding_scale=0.25), "F32", 700),
}


@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_matches_pytorch_after_conversion(case, tiny_target, tmp_path):
    spec, quant, draft_vocab = CASES[case]
    model = random_drafter(tiny_target, spec, draft_vocab)
    hf = export_hf(model, tmp_path / "hf", n_target_layers=4, dtype="f32")
    hf_ids = json.loads((hf / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert hf_ids == [i - 1 for i in spec.target_layers]
    gguf = hf_to_gguf(hf, tmp_path / "d.gguf", tiny_target, quant=quant)
    if quant == "F16":  # the same weights on both sides: llama.cpp holds the matrices in half precision
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.copy_(p.half().float())
    agree, rel = llama_vs_torch(tiny_target, gguf, model, hf_ids)
    assert agree >= 0.99, f"argmax agreement {agree:.3f}"
    assert rel <= 1e-2, f"max relative error {rel:.4f}"


def test_wrong_tap_is_caught(tiny_target, tmp_path):
    """Writing the HF ids raw (no +1) must break agreement: the check can fail."""
    spec, _, _ = CASES["full-attention F32"]
    model = random_drafter(tiny_target, spec)
    hf = export_hf(model, tmp_path / "hf", n_target_layers=4, dtype="f32")
    gguf = hf_to_gguf(hf, tmp_path / "d.gguf", tiny_target, quant="F32")
    hf_ids = [i - 1 for i in spec.target_layers]
    agree, rel = llama_vs_torch(tiny_target, gguf, model, [i - 1 for i in hf_ids])  # torch side tapped one layer early
    assert agree < 0.9 or rel > 1e-2


def _sharded_checkpoint(model: DFlashDraft, d: Path) -> Path:
    """An HF folder in two bf16 shards with an index, as published checkpoints come."""
    export_hf(model, d / "single", n_target_layers=4, dtype="bf16")
    ck = read_checkpoint(d / "single")
    names = sorted(ck.files)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    out = d / "sharded"
    out.mkdir()
    for shard, group in shards.items():
        tensors = {n: ck.get(n) for n in group}
        write_safetensors(out / shard, {n: (t if t.dtype.kind != "f" else t) for n, t in tensors.items()}, "bf16")
    weight_map = {n: s for s, group in shards.items() for n in group}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text((d / "single" / "config.json").read_text())
    return out


def test_hf_gguf_hf_round_trip_preserves_every_tensor(tiny_target, tmp_path):
    spec, _, _ = CASES["sliding causal, draft vocab F32"]
    model = random_drafter(tiny_target, spec, draft_vocab=700, seed=3)
    src = _sharded_checkpoint(model, tmp_path)
    gguf = hf_to_gguf(src, tmp_path / "d.gguf", tiny_target, quant="F32")
    back = gguf_to_hf(gguf, tmp_path / "back", dtype="bf16")
    a, b = read_checkpoint(src), read_checkpoint(back)
    assert sorted(a.files) == sorted(b.files)
    assert "d2t" in a.files and "t2d" in a.files and "lm_head.weight" in a.files
    for name in a.files:
        x, y = a.get(name), b.get(name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y), name
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (src, back))
    assert ca == cb
    info, _ = read_dflash_gguf(gguf)
    assert info.spec.target_layers == spec.target_layers  # llama.cpp convention in the GGUF
    assert info.spec.swa_layers == [True, True] and info.spec.swa_window == 5 and info.spec.causal is True
    assert info.spec.embedding_scale == 0.25


def test_target_layer_formula_matches_published_checkpoints():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B/8B-DFlash-b16
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.6-27B-DFlash
    assert build_target_layer_ids(40, 5) == [1, 10, 19, 28, 37]  # Qwen3.5-35B-A3B-DFlash
    assert build_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]  # Qwen3.5-4B-DFlash


def test_zlab_config_maps_to_llama_cpp_keys():
    """A Qwen3.6-27B-DFlash-like config: +1 taps, SWA pattern and window, no causal key, yarn kept."""
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 5,
        "num_target_layers": 64, "block_size": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000000, "vocab_size": 248320,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
        "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048, "max_position_embeddings": 262144,
    }
    s = spec_from_hf(cfg).spec
    assert s.target_layers == [2, 17, 32, 47, 62]
    assert s.swa_window == 2048 and s.swa_layers == [True, True, True, True, False]
    assert s.causal is None and s.mask_token_id == 248070 and s.head_dim == 128 and s.rope_theta == 1e7
    assert s.rope_scaling["rope_type"] == "yarn"


def _cli_error(monkeypatch, capsys, *args) -> str:
    monkeypatch.setattr(sys, "argv", ["localflash", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 1
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


def test_bad_inputs_fail_with_one_clear_line(tiny_target, tmp_path, monkeypatch, capsys):
    spec, _, _ = CASES["full-attention F32"]
    model = random_drafter(tiny_target, spec)
    good = export_hf(model, tmp_path / "good", n_target_layers=4, dtype="bf16")

    not_dflash = tmp_path / "llama"
    not_dflash.mkdir()
    (not_dflash / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    line = _cli_error(monkeypatch, capsys, "convert-drafter", not_dflash, tmp_path / "x.gguf", "--target", tiny_target)
    assert "not a DFlash drafter" in line and "Qwen3ForCausalLM" in line

    wide = export_hf(random_drafter(tiny_target, spec), tmp_path / "wide", n_target_layers=4, dtype="bf16")
    cfg = json.loads((wide / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 5]  # taps layer 5 of a 4-layer target
    (wide / "config.json").write_text(json.dumps(cfg))
    line = _cli_error(monkeypatch, capsys, "convert-drafter", wide, tmp_path / "x.gguf", "--target", tiny_target)
    assert "taps target layer 5" in line and "4 layers" in line

    cfg = json.loads((good / "config.json").read_text())
    cfg["num_target_layers"] = 28
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text(json.dumps(cfg))
    (deep / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    line = _cli_error(monkeypatch, capsys, "convert-drafter", deep, tmp_path / "x.gguf", "--target", tiny_target)
    assert "28-layer target" in line

    sharded = _sharded_checkpoint(model, tmp_path / "s")
    (sharded / "model-00002-of-00002.safetensors").unlink()
    line = _cli_error(monkeypatch, capsys, "convert-drafter", sharded, tmp_path / "x.gguf", "--target", tiny_target)
    assert "missing safetensors shard model-00002-of-00002.safetensors" in line
    assert not (tmp_path / "x.gguf").exists()


def test_hidden_size_mismatch(tiny_target, tmp_path):
    spec = DFlashSpec(n_embd=128, n_layer=1, n_head=4, n_head_kv=2, target_layers=[1, 2], mask_token_id=MASK)
    embed = np.zeros((32000, 128), np.float32)
    m = DFlashDraft(spec, torch.from_numpy(embed), torch.from_numpy(embed))
    hf = export_hf(m, tmp_path / "hf", n_target_layers=4, dtype="bf16")
    with pytest.raises(LocalflashError, match="hidden size 128 differs"):
        hf_to_gguf(hf, tmp_path / "x.gguf", tiny_target)


def test_cli_converts_and_quantizes(tiny_target, tmp_path, monkeypatch, capsys):
    model = random_drafter(tiny_target, CASES["full-attention F32"][0])
    hf = export_hf(model, tmp_path / "hf", n_target_layers=4, dtype="bf16")
    monkeypatch.setattr(sys, "argv", ["localflash", "convert-drafter", str(hf), str(tmp_path / "d.gguf"), "--target", str(tiny_target)])
    try:
        cli.main()
    except SystemExit as e:
        assert e.code in (0, None)
    assert capsys.readouterr().out.strip() == str(tmp_path / "d.gguf")
    d = Model(tmp_path / "d.gguf")
    assert d.arch == "dflash" and d.target_layer_ids() == [1, 3] and d.mask_token() == MASK
    assert d.meta("general.file_type") == "15"  # Q4_K_M


def test_dflash2_round_trip_keeps_tensors_keys_and_drafts(tiny_target, tmp_path):
    """DFlash2 GGUF -> HF (z-lab DFlash2DraftModel names) -> GGUF: same tensors, keys and selector drafts."""
    from localflash.formats.dflash_gguf import DFlash2Spec
    from localflash.testing.tiny import write_dflash2

    spec = DFlash2Spec(n_layer=2, target_layers=[1, 3], mask_token_id=MASK, block_size=8, selector_top_k=3, seed=7)
    src = write_dflash2(tmp_path / "d2.gguf", spec)
    hf = gguf_to_hf(src, tmp_path / "hf", dtype="f32")
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert {k: cfg["dflash_config"][k] for k in spec.dflash2_keys()} == spec.dflash2_keys()
    names = set(read_checkpoint(hf).files)
    assert {"layers.1.attention_conv.base_kernel", "layers.0.mlp_conv.kernel_projection.weight",
            "candidate_selector.predecessor_codebook", "candidate_selector.hidden_projection.weight"} <= names
    back = hf_to_gguf(hf, tmp_path / "back.gguf", tiny_target, quant="F32")
    (_, t1), (i2, t2) = read_dflash_gguf(src), read_dflash_gguf(back)
    assert isinstance(i2.spec, DFlash2Spec) and i2.spec.dflash2_keys() == spec.dflash2_keys()
    assert sorted(t1) == sorted(t2) and all(np.array_equal(t1[k], t2[k]) for k in t1)

    tgt = Model(tiny_target)
    toks = tgt.tokenize(TEXT)[:40]
    drafts = []
    for path in (src, back):
        ctx = Context(tgt, ContextOptions(n_ctx=256, n_outputs_max=16, n_threads=1))
        dr = DFlashDrafter(Model(path), tgt, ctx, 256, n_threads=1)
        ctx.decode(toks, 0, "last")
        dr.on_target_decode(ctx, 0, len(toks))
        drafts.append(dr.propose(toks + [toks[5]], len(toks), 7))
        dr.close()
        ctx.close()
    assert drafts[0] == drafts[1] and len(drafts[0]) == 7
