"""HF DSpark checkpoints (``DSparkDraftModel``: DFlash + ``markov_head.*`` + ``confidence_head.proj``) to GGUF.

The central check: random DSpark weights written once directly by our GGUF writer and once as an HF
checkpoint (safetensors + config.json) converted by ``convert-drafter`` give the same tensors and keys,
and the converted file drafts cycle for cycle what the direct one drafts, lossless against plain greedy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader

from localflash.engine import make_drafter
from localflash.errors import LocalflashError
from localflash.formats.dflash_gguf import DrafterInfo, DSparkSpec, write_dflash_gguf
from localflash.formats.dflash_hf import gguf_to_hf_name, hf_config
from localflash.formats.dflash_hf import hf_to_gguf as dflash_hf_to_gguf
from localflash.formats.dspark_hf import DSPARK_TENSORS, hf_to_gguf
from localflash.formats.safetensors import write_safetensors
from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.loop import Engine
from localflash.speculative.stats import Stats
from localflash.testing.tiny import dspark_tensors, vocab_path

N_CTX = 512
_HF_HEADS = {g: h for h, g in DSPARK_TENSORS.items()}


def write_hf_dspark(d, spec: DSparkSpec, tensors: dict[str, np.ndarray], **config) -> None:
    """An HF DSpark checkpoint of ``tensors`` (GGUF names): z-lab names, half of them ``model.``-prefixed."""
    d.mkdir()
    hf = {}
    for k, (g, arr) in enumerate(tensors.items()):
        name = _HF_HEADS.get(g) or gguf_to_hf_name(g)
        hf[("model." if k % 2 else "") + name] = arr
    write_safetensors(d / "model.safetensors", hf, "f32")
    cfg = hf_config(DrafterInfo(spec, 32000, None))
    cfg.update({"architectures": ["DSparkDraftModel"], "markov_head_type": "vanilla", **config})
    (d / "config.json").write_text(json.dumps(cfg))


def drafts_of(target: Model, path, prompt: str, p_min: float) -> tuple[list[int], list[list[int]]]:
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_outputs_max=17, n_threads=1))
    drafter = make_drafter("dflash", target, ctx, Model(path), n_ctx=N_CTX, threads=1, p_min=p_min) if path else None
    drafts: list[list[int]] = []
    if drafter is not None:
        assert drafter.name == "dspark"
        propose = drafter.propose
        drafter.propose = lambda h, npast, k: drafts.append(propose(h, npast, k)) or drafts[-1]
    engine = Engine(target, ctx, drafter, adaptive=False)
    out = [t for chunk in engine.generate(target.tokenize(prompt), 32, None, Stats()) for t in chunk]
    engine.close()
    return out, drafts


def gguf_contents(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    keys = {k: f.contents() for k, f in r.fields.items() if k.startswith("dflash.")}
    return keys, {t.name: np.asarray(t.data).copy() for t in r.tensors}


def test_a_converted_hf_dspark_checkpoint_drafts_like_the_same_weights_written_directly(lf, tiny_target, tmp_path):
    spec = DSparkSpec(target_layers=[1, 2, 3], seed=6)
    tensors = dspark_tensors(spec, agree_with=tiny_target)  # the Markov head is the target's bigram: drafts get accepted
    spec.markov_rank = tensors["markov_w1.weight"].shape[1]
    direct = write_dflash_gguf(tmp_path / "direct.gguf", spec, tensors, tokenizer_from=vocab_path())
    write_hf_dspark(tmp_path / "hf", spec, tensors)
    r = lf("convert-drafter", tmp_path / "hf", tmp_path / "conv.gguf", "--target", tiny_target, "--quant", "F32")
    assert r.returncode == 0, r.stderr
    assert f"DSpark Markov rank {spec.markov_rank}, a confidence head, anchor-first block" in r.stderr

    want_keys, want = gguf_contents(direct)
    got_keys, got = gguf_contents(tmp_path / "conv.gguf")
    assert got_keys.pop("dflash.n_target_layers", None) is None and got_keys == want_keys
    assert got_keys["dflash.sample_from_anchor"] is True and got_keys["dflash.has_confidence_head"] is True
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    target = Model(tiny_target)
    prompt = "paper over nine silver hills"
    plain, _ = drafts_of(target, None, prompt, 0.0)
    for p_min in (0.0, 0.5):
        out_direct, drafts_direct = drafts_of(target, direct, prompt, p_min)
        out_conv, drafts_conv = drafts_of(target, tmp_path / "conv.gguf", prompt, p_min)
        assert drafts_conv == drafts_direct and sum(map(len, drafts_conv)) > 0, p_min
        assert out_conv == out_direct == plain, p_min


def test_the_speculators_schema_gives_layer_input_taps_a_bonus_anchor_block_and_no_confidence_head(tiny_target, tmp_path):
    spec = DSparkSpec(target_layers=[1, 3], block_size=6, sample_from_anchor=False, confidence=False)
    tensors = dspark_tensors(spec)
    write_hf_dspark(tmp_path / "hf", spec, tensors, transformer_layer_config={"num_hidden_layers": spec.n_layer},
                    aux_hidden_state_layer_ids=[1, 3], mask_token_id=spec.mask_token_id)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    del cfg["dflash_config"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    out = hf_to_gguf(tmp_path / "hf", tmp_path / "conv.gguf", tiny_target, quant="F32")
    keys, got = gguf_contents(out)
    assert list(keys["dflash.target_layers"]) == [1, 3] and keys["dflash.block_size"] == 6
    assert keys["dflash.sample_from_anchor"] is False and keys["dflash.has_confidence_head"] is False
    assert "conf_proj.weight" not in got and sorted(got) == sorted(tensors)


def test_a_non_vanilla_markov_head_is_refused_in_one_line(lf, tiny_target, tmp_path):
    spec = DSparkSpec(target_layers=[1, 2, 3])
    write_hf_dspark(tmp_path / "hf", spec, dspark_tensors(spec), markov_head_type="gated")
    r = lf("convert-drafter", tmp_path / "hf", tmp_path / "x.gguf", "--target", tiny_target)
    assert r.returncode != 0 and "markov_head_type 'gated' is not supported" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    with pytest.raises(LocalflashError, match="markov_head_type"):
        hf_to_gguf(tmp_path / "hf", tmp_path / "x.gguf", tiny_target)
    with pytest.raises(LocalflashError, match="is a DSpark checkpoint"):  # the DFlash-only entry point says where to go
        dflash_hf_to_gguf(tmp_path / "hf", tmp_path / "x.gguf", tiny_target)
