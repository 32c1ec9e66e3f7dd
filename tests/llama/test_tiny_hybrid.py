"""The tiny qwen35 / qwen3next writers make files llama.cpp loads and decodes as hybrids."""

from __future__ import annotations

import numpy as np
import pytest

from localflash.formats.gguf_meta import read_meta
from localflash.llama import Context, ContextOptions, Model


def _greedy(path, n: int = 12) -> list[int]:
    m = Model(path)
    c = Context(m, ContextOptions(n_ctx=128, n_threads=1, n_rs_seq=4))
    toks = m.tokenize("The quick brown fox")
    c.decode(toks, 0)
    out, pos = [], len(toks)
    for _ in range(n):
        out.append(int(np.argmax(c.logits(-1))))
        c.decode(out[-1:], pos)
        pos += 1
    c.close()
    return out


@pytest.mark.parametrize("fixture, arch, n_nextn", [
    ("tiny_qwen35", "qwen35", 0), ("tiny_qwen35_mtp", "qwen35", 1), ("tiny_qwen3next", "qwen3next", 0),
])
def test_tiny_hybrid_layout_is_what_llama_cpp_reads(request, fixture, arch, n_nextn):
    meta = read_meta(request.getfixturevalue(fixture))
    assert meta.arch == arch and meta.n_layer == 6 and meta.n_layer_nextn == n_nextn
    assert meta.recurrent_layers[:6] == [True, True, False, True, True, False]
    assert any(t.name == "blk.6.nextn.eh_proj.weight" for t in meta.tensors) == bool(n_nextn)


def test_tiny_hybrids_decode_and_mtp_block_leaves_the_trunk_alone(tiny_qwen35, tiny_qwen35_mtp, tiny_qwen3next):
    plain, with_mtp, nxt = _greedy(tiny_qwen35), _greedy(tiny_qwen35_mtp), _greedy(tiny_qwen3next)
    assert plain == with_mtp  # the nextn block is skipped by the main graph
    assert len(set(plain)) > 3 and len(set(nxt)) > 3 and plain != nxt


def test_tiny_qwen35_drafters_share_the_vocab(tiny_qwen35, tiny_qwen35_drafters, tiny_qwen35_dflash):
    target = Model(tiny_qwen35)
    for path in tiny_qwen35_drafters.values():
        d = Model(path)
        assert d.arch == "qwen35" and d.n_vocab == target.n_vocab
    assert _greedy(tiny_qwen35_drafters["same"]) == _greedy(tiny_qwen35)
    assert Model(tiny_qwen35_dflash).target_layer_ids() == [1, 3, 5]
