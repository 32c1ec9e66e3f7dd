"""Training a DFlash drafter: data from the real engine, anchors, masks, loss, resumable training, the CLI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import torch  # noqa: E402  (the train extra; `make install` installs it)

from localflash import cli  # noqa: E402
from localflash.formats.dflash_gguf import DFlashSpec, read_dflash_gguf  # noqa: E402
from localflash.llama import Context, ContextOptions, Model  # noqa: E402
from localflash.speculative.drafter import NgramDrafter  # noqa: E402
from localflash.speculative.loop import Engine  # noqa: E402
from localflash.speculative.sampling import SamplingParams  # noqa: E402
from localflash.testing.tiny import TinySpec, write_target  # noqa: E402
from localflash.train.anchors import IGNORE, build_blocks, sample_anchors, valid_anchors  # noqa: E402
from localflash.train.data import FeatureRecorder, GenConfig, build_dataset  # noqa: E402
from localflash.train.loss import default_gamma, dflash_loss, position_weights  # noqa: E402
from localflash.train.model import DFlashDraft, target_matrices  # noqa: E402
from localflash.train.trainer import TrainConfig, Trainer  # noqa: E402

MASK = 31999
TOPICS = "river garden stone paper silver hills light quiet nine birds".split()


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_target(tmp_path_factory.mktemp("train") / "target.gguf", TinySpec(arch="qwen3", n_layer=4, n_head_kv=2, seed=7, layer_scale=0.1))


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    p.write_text("".join(json.dumps({"question": f"Tell me about the {a} and the {b}."}) + "\n" for a in TOPICS for b in TOPICS[:2]))
    return p


@pytest.fixture(scope="module")
def store(target, tmp_path_factory):
    """Responses and features of 16 prompts, made by the target through the engine."""
    prompts = [f"Tell me about the {a}" + f" and the {b}" * (i % 4) + "." for i, (a, b) in enumerate(zip(TOPICS * 2, TOPICS[::-1] * 2))][:16]
    cfg = GenConfig(str(target), [2, 3], max_new_tokens=40, max_prompt_tokens=256, n_threads=1)
    return build_dataset(cfg, prompts, list(range(16)), tmp_path_factory.mktemp("data"))


def test_position_weights_match_formula():
    for b in (8, 10, 16):
        g = default_gamma(b)
        w = position_weights(b, g)
        assert w[0] == 0.0
        for k in range(1, b):
            assert w[k].item() == pytest.approx(math.exp(-(k - 1) / g), rel=1e-6)
    assert default_gamma(16) == 7.0 and default_gamma(10) == 5.0 and default_gamma(8) == 4.0


def test_loss_is_the_weighted_mean_of_cross_entropies():
    torch.manual_seed(0)
    logits = torch.randn(3, 3, 11)  # draft slots 1..3 of three blocks
    labels = torch.tensor([[1, 2, 3], [4, IGNORE, IGNORE], [0, 5, 6]])
    w = position_weights(4, 2.0)
    loss, stats = dflash_loss(logits, labels, w[1:])
    num = den = 0.0
    for i in range(3):
        for k in range(3):
            if labels[i, k] >= 0:
                ce = -torch.log_softmax(logits[i, k], -1)[labels[i, k]].item()
                num += w[k + 1].item() * ce
                den += w[k + 1].item()
    assert loss.item() == pytest.approx(num / den, rel=1e-5)
    assert stats["n_labels"] == 7
    perfect = torch.full((2, 3, 11), -10.0)
    for k, t in enumerate([1, 2, 3]):
        perfect[0, k, t] = 10.0
    perfect[1, 0, 1] = 10.0  # block 2: slot 1 right, slot 2 wrong
    _, s = dflash_loss(perfect, torch.tensor([[1, 2, 3], [1, 2, 3]]), w[1:])
    assert s["tau"] == pytest.approx(1 + (3 + 1) / 2)  # mean accepted run + the bonus token


def test_anchors_never_cross_sequence_ends():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_prompt = int(rng.integers(1, 20))
        n = n_prompt + int(rng.integers(0, 40))
        tokens = rng.integers(0, 1000, n)
        anchors = sample_anchors(rng, n, n_prompt, int(rng.integers(1, 50)))
        assert np.all(np.diff(anchors) > 0)
        assert set(anchors) <= set(valid_anchors(n, n_prompt))
        if len(anchors):
            assert anchors.min() >= n_prompt and anchors.max() <= n - 2
        blocks, labels = build_blocks(tokens, n_prompt, anchors, 16, MASK)
        for a, blk, lab in zip(anchors, blocks, labels):
            assert blk[0] == tokens[a] and np.all(blk[1:] == MASK) and lab[0] == IGNORE
            for k in range(1, 16):
                assert lab[k] == (tokens[a + k] if a + k < n else IGNORE)
            assert lab[1] != IGNORE  # every anchor has at least one label


def test_padded_batches_take_labels_only_from_their_own_sequence(store, target):
    model = _model(target, DFlashSpec(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, target_layers=[2, 3], mask_token_id=MASK))
    tr = Trainer(model, store, store.records, TrainConfig(anchors=50, batch=8, steps=1, precision="fp32"), store.dir / "t")
    lengths = {len(r.tokens) for r in store.records}
    assert len(lengths) > 1  # padding really happens
    batch = tr.make_batch(list(range(8)), step=3)
    for j, rec in enumerate(tr.records[:8]):
        n = len(rec.tokens)
        for a, blk, lab in zip(batch["anchors"][j], batch["blocks"][j], batch["labels"][j]):
            if lab[1] == IGNORE:  # a padding slot
                assert (lab == IGNORE).all()
                continue
            assert rec.n_prompt <= a <= n - 2 and blk[0] == rec.tokens[a]
            for k in range(1, 16):
                assert lab[k] == (rec.tokens[a + k] if a + k < n else IGNORE)


def _model(target, spec, llama_semantics=True, seed=0):
    embed, head = target_matrices(target)
    m = DFlashDraft(spec, torch.from_numpy(embed), torch.from_numpy(head), llama_semantics=llama_semantics)
    m.reset_parameters(std=0.2, seed=seed)
    return m


def test_blocks_see_only_context_before_their_anchor(target):
    spec = DFlashSpec(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, target_layers=[2, 3], mask_token_id=MASK)
    m = _model(target, spec).eval()
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 40, 128, generator=g)
    anchors = torch.tensor([[25]])
    blocks = torch.tensor([[[7] + [MASK] * 15]])
    with torch.no_grad():
        base = m(feats, blocks, anchors)
        later = feats.clone()
        later[:, 25:] += 5 * torch.randn(1, 15, 128, generator=g)  # the anchor's own features and after
        assert torch.equal(m(later, blocks, anchors), base)
        earlier = feats.clone()
        earlier[:, 24] += 5.0
        assert not torch.allclose(m(earlier, blocks, anchors), base)


def test_sliding_layers_drop_context_outside_the_window(target):
    w = 6
    spec = DFlashSpec(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, target_layers=[2, 3], mask_token_id=MASK, swa_window=w, swa_layers=[True])
    m = _model(target, spec).eval()
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(1, 40, 128, generator=g)
    a = 30
    anchors, blocks = torch.tensor([[a]]), torch.tensor([[[7] + [MASK] * 15]])
    with torch.no_grad():
        base = m(feats, blocks, anchors)
        far = feats.clone()
        far[:, : a - w + 1] += 5.0  # q_pos - k_pos >= window for every query of the block
        assert torch.equal(m(far, blocks, anchors), base)
        near = feats.clone()
        near[:, a - 1] += 5.0
        assert not torch.allclose(m(near, blocks, anchors), base)
    # causal sliding layers (the HF default without llama.cpp's single flag) do not see later block slots
    mc = _model(target, spec, llama_semantics=False).eval()
    assert mc.layers[0].causal and not m.layers[0].causal
    with torch.no_grad():
        x = mc(feats, blocks, anchors)
        other = blocks.clone()
        other[0, 0, 5] = 123
        y = mc(feats, other, anchors)
    assert torch.equal(x[..., :5, :], y[..., :5, :]) and not torch.allclose(x[..., 5:, :], y[..., 5:, :])


def test_recorded_features_equal_a_plain_prefill(target):
    """The engine-side recorder (n-gram drafting, verify batches) keeps what a one-shot prefill computes."""
    model = Model(target)
    ctx = Context(model, ContextOptions(n_ctx=512, n_outputs_max=9, n_threads=1))
    ctx.capture_layer_inputs([1, 3])
    rec = FeatureRecorder(NgramDrafter(8), [1, 3], 512, model.n_embd)
    engine = Engine(model, ctx, rec, adaptive=False)
    prompt = model.tokenize("the river and the garden " * 6)
    out = [t for chunk in engine.generate(prompt, 60, SamplingParams()) for t in chunk]
    seq = prompt + out
    got = rec.buf[: len(seq) - 1].copy()
    assert rec.n >= len(seq) - 1
    fresh = Context(model, ContextOptions(n_ctx=512, n_threads=1))
    fresh.capture_layer_inputs([1, 3])
    fresh.decode(seq[:-1], 0, "none")
    want = np.concatenate([fresh.layer_input(lid, len(seq) - 1) for lid in (1, 3)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    engine.close()
    fresh.close()


def test_tiny_drafter_trains_loss_falls_and_resumes_exactly(store, target, tmp_path):
    spec = DFlashSpec(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, target_layers=[2, 3], mask_token_id=MASK)
    cfg = TrainConfig(anchors=24, batch=4, steps=30, lr=3e-3, warmup=0.1, precision="fp32", ckpt_every=5, threads=1)
    full = Trainer(_model(target, spec), store, store.records, cfg, tmp_path / "full")
    st = full.run()
    losses = [h["loss"] for h in st.history]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])

    # stop after 12 steps, resume in a new trainer: same weights as the uninterrupted run
    short = TrainConfig(**{**cfg.__dict__})
    part = Trainer(_model(target, spec), store, store.records, short, tmp_path / "part")
    part.run(should_stop=lambda: part.state.step >= 12)
    assert part.state.step == 12 and (tmp_path / "part" / "checkpoint.pt").exists()
    again = Trainer(_model(target, spec, seed=99), store, store.records, short, tmp_path / "part")
    assert again.resume() and again.state.step == 12
    again.run()
    for (k, a), b in zip(full.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k


def test_train_drafter_cli_end_to_end(target, prompts_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "d.gguf"
    args = ["localflash", "train-drafter", "--target", str(target), "--prompts", str(prompts_file), "--out", str(out),
            "--work-dir", str(tmp_path / "work"), "--max-new-tokens", "24", "--holdout-every", "10", "--layers", "2",
            "--sliding-window", "4", "--full-layers", "1",
            "--taps", "1", "--draft-vocab", "400", "--steps", "6", "--anchors", "8", "--quant", "Q8_0", "--threads", "1",
            "--eval-tokens", "12"]
    monkeypatch.setattr(sys, "argv", args)
    try:
        cli.main()
    except SystemExit as e:
        assert e.code in (0, None)
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    d = Model(out)
    assert d.arch == "dflash" and d.mask_token() >= 0 and d.meta("dflash.block_size") == "16"
    info, _ = read_dflash_gguf(out)
    assert info.spec.swa_layers == [True, False] and info.spec.swa_window == 4  # sliding, then one full layer
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert report["held_out"]["dflash"]["prompts"] == 2 and report["held_out"]["dflash"]["tau"] >= 1.0
    assert report["spec"]["target_layers"] == [3]  # one tap of a 4-layer target: layer 2's output, input of layer 3
