"""The low-level runtime against llama-cpp-python's high-level Llama, and layer-input capture."""

from __future__ import annotations


import numpy as np
import pytest

from localflash.bench.prompts import prompt_set_rows
from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.loop import Engine

def spec_bench_prompts(n: int) -> list[str]:
    rows = prompt_set_rows("spec_bench")
    picked = rows[:: max(1, len(rows) // n)][:n]
    return [r["turns"][0][:400] for r in picked]


def ours_greedy(model: Model, tokens: list[int], n: int) -> list[int]:
    ctx = Context(model, ContextOptions(n_ctx=1024, n_threads=1))
    engine = Engine(model, ctx)
    out = [t for chunk in engine.generate(tokens, n) for t in chunk]
    engine.close()
    return out


def llama_greedy(llm, model: Model, tokens: list[int], n: int) -> list[int]:
    llm.reset()
    out = []
    for tok in llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
        if model.is_eog(tok) or len(out) == n:
            break
        out.append(tok)
    return out


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_greedy_equals_high_level_llama(which, tiny_target, smollm2):
    from llama_cpp import Llama

    path = tiny_target if which == "tiny" else smollm2
    model = Model(path)
    # our contexts run flash attention (AUTO resolves to on); the high-level default is off
    llm = Llama(model_path=str(path), n_ctx=1024, n_threads=1, n_threads_batch=1, flash_attn=True, verbose=False)
    compared_full = 0
    for text in spec_bench_prompts(40):
        tokens = model.tokenize(text)
        ours = ours_greedy(model, tokens, 64)
        theirs = llama_greedy(llm, model, tokens, 64)
        assert ours == theirs, f"diverged on prompt {text[:40]!r}"
        compared_full += len(ours) == 64  # EOS may end a continuation early
        if compared_full == 20:
            break
    assert compared_full == 20
    llm.close()


def test_layer_inputs_shape_and_dependence(tiny_target):
    model = Model(tiny_target)
    ctx = Context(model, ContextOptions(n_ctx=256))
    ctx.capture_layer_inputs([0, 1, 3])
    a = model.tokenize("The quick brown fox jumps over the lazy dog")
    ctx.decode(a, 0, "last")
    rows = {lid: ctx.layer_input(lid, len(a)).copy() for lid in (0, 1, 3)}
    for x in rows.values():
        assert x.shape == (len(a), model.n_embd) and x.dtype == np.float32
        assert np.isfinite(x).all()
    assert not np.allclose(rows[1], rows[3])  # layers differ
    # a different token at position 2 changes rows from position 2 on, not before (causal)
    b = list(a)
    b[2] = a[2] + 1
    ctx.clear()
    ctx.decode(b, 0, "last")
    other = ctx.layer_input(3, len(b))
    assert np.array_equal(other[:2], rows[3][:2])
    assert not np.allclose(other[2:], rows[3][2:])


def test_layer_inputs_beyond_target_layers_is_an_error(tiny_target):
    from localflash.errors import LocalflashError

    model = Model(tiny_target)
    ctx = Context(model, ContextOptions(n_ctx=64))
    with pytest.raises(LocalflashError, match="outside"):
        ctx.capture_layer_inputs([model.n_layer])


def test_rollback_then_redecode_gives_same_logits(tiny_target):
    model = Model(tiny_target)
    ctx = Context(model, ContextOptions(n_ctx=256, n_outputs_max=8))
    toks = model.tokenize("one two three four five six")
    ctx.decode(toks, 0, "last")
    ctx.decode([5, 6, 7], len(toks), "all")
    first = ctx.all_logits().copy()
    ctx.seq_rm(len(toks))
    assert ctx.pos_max() == len(toks) - 1
    ctx.decode([5, 6, 7], len(toks), "all")
    assert np.array_equal(ctx.all_logits(), first)


def test_chunked_prompt_equals_single_batch(tiny_target):
    """A prompt longer than n_batch is decoded in chunks with identical results."""
    model = Model(tiny_target)
    text = " ".join(f"word{i}" for i in range(120))
    tokens = model.tokenize(text)
    big = Context(model, ContextOptions(n_ctx=1024, n_batch=512))
    small = Context(model, ContextOptions(n_ctx=1024, n_batch=32, n_ubatch=32))
    outs = []
    for ctx in (big, small):
        engine = Engine(model, ctx)
        outs.append([t for c in engine.generate(tokens, 32) for t in c])
    assert len(tokens) > 32 * 3
    assert outs[0] == outs[1]
