"""shaped.write_random with a real tokenizer: the file tokenizes and decodes like the vocabulary it was copied from."""

from __future__ import annotations

import numpy as np
import pytest

from localflash.llama import Context, ContextOptions, Model
from localflash.testing.shaped import ModelSpec, write_random
from localflash.testing.tiny import vocab_path

SPEC = ModelSpec("llama", "random-llama-spm", n_layer=1, n_embd=64, n_ff=128, n_head=1, n_head_kv=1, head_dim=64,
                 n_vocab=32000, n_ctx_train=512)
POOL = np.random.default_rng(0).integers(0, 256, size=1 << 20, dtype=np.uint8)


def test_write_random_copies_a_real_tokenizer_that_llama_cpp_tokenizes_and_decodes(tmp_path, tiny_target):
    path = write_random(tmp_path / "random.gguf", SPEC, "Q8_0", POOL, tokenizer_from=vocab_path())
    text = "The quick brown fox jumps over the lazy dog."
    m, ref = Model(str(path)), Model(str(tiny_target))  # tiny_target carries the same vocabulary
    ctx = Context(m, ContextOptions(n_ctx=64, n_threads=1))
    try:
        assert m.n_vocab == 32000
        assert m.tokenize(text) == ref.tokenize(text)
        ctx.decode(m.tokenize(text), 0, "last")
        assert np.isfinite(ctx.logits(-1)).all()
    finally:
        ctx.close()
        m.close()
        ref.close()


def test_write_random_refuses_a_tokenizer_of_another_size(tmp_path):
    with pytest.raises(ValueError, match="does not hold 32001 tokens"):
        write_random(tmp_path / "bad.gguf", ModelSpec(**{**SPEC.__dict__, "n_vocab": 32001}), "Q8_0", POOL,
                     tokenizer_from=vocab_path())
