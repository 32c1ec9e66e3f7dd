"""The metadata reader on tiny models, SmolLM2 and real-shaped (sparse) GGUFs; nothing is loaded."""

from __future__ import annotations

import pytest

from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import read_meta, tensor_bytes
from localflash.testing.shaped import PRESETS, ModelSpec, write_preset, write_shaped
from localflash.testing.tiny import TinySpec, write_target


def test_tiny_llama_layers_and_bytes(tmp_path):
    path = write_target(tmp_path / "t.gguf", TinySpec(n_embd=128, n_layer=3, n_head=4, n_head_kv=2, n_ff=384))
    m = read_meta(path)
    assert (m.arch, m.n_layer, m.n_layer_nextn, m.n_embd, m.n_ff) == ("llama", 3, 0, 128, 384)
    assert m.n_head == [4, 4, 4] and m.n_head_kv == [2, 2, 2] and m.head_dim_k == 32
    assert m.n_vocab == 32000 and m.known_arch and not m.warnings
    # f32 everywhere: a block is 4 bytes per parameter
    block = 4 * (128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 128 * 384 + 2 * 128)
    assert m.layer_bytes == [block] * 3
    assert m.input_bytes == 4 * 32000 * 128
    assert m.output_bytes == 4 * (32000 * 128 + 128)
    assert [(k.index, k.n_embd_k, k.n_embd_v, k.swa) for k in m.kv_layers()] == [(i, 64, 64, False) for i in range(3)]
    assert m.tied_head_bytes == 0 and m.has_own_head


def test_smollm2(smollm2):
    m = read_meta(smollm2)
    assert (m.arch, m.n_layer, m.n_embd, m.n_ff, m.n_vocab) == ("llama", 30, 576, 1536, 49152)
    assert (m.n_head[0], m.n_head_kv[0], m.head_dim_k) == (9, 3, 64)
    assert {t.type for t in m.tensors} == {"Q4_1", "Q8_0", "F32"}
    # tied embeddings: no output.weight, so a GPU-resident head is a second copy of token_embd
    assert m.tied_head_bytes == m.input_bytes == tensor_bytes("q8_0", (576, 49152))
    assert m.weight_bytes == 96_576_768
    assert m.file_bytes - m.weight_bytes < 2 * 1024**2  # the rest is header (tokenizer)


def test_qwen36_27b_shape(shaped):
    m = shaped["27b"]
    assert (m.arch, m.n_layer, m.n_layer_nextn, m.n_layer_all) == ("qwen35", 64, 1, 65)
    kv = m.kv_layers()
    assert [k.index for k in kv] == list(range(3, 64, 4))  # 16 attention blocks, 48 Gated-DeltaNet
    assert {(k.n_embd_k, k.n_embd_v) for k in kv} == {(1024, 1024)}
    assert sum(m.recurrent_layers) == 48
    # conv state 3 x (6144 + 2*16*128) + delta state 128 x 6144, f32, 48 blocks
    assert m.recurrent_row_bytes == 48 * 4 * (3 * 10240 + 128 * 6144) == 156_893_184
    assert m.file_bytes == pytest.approx(16.8e9, rel=0.005)  # the size people quote for Qwen3.6-27B Q4_K_M
    mtp = m.file_bytes - m.weight_bytes
    assert 0.2e9 < mtp < 0.3e9 and m.layer_bytes[64] == 0  # the MTP block is skipped unless MTP drafting
    assert m.input_bytes == tensor_bytes("q4_k", (5120, 248320))
    assert m.output_bytes == tensor_bytes("q6_k", (5120, 248320)) + 4 * 5120


def test_dflash_drafter_shape(shaped):
    d = shaped["dflash"]
    assert (d.arch, d.n_layer, d.n_embd, d.block_size) == ("dflash", 5, 5120, 16)
    assert not d.has_own_head and d.input_bytes == 0 and d.output_vocab == 248320
    assert d.n_embd_inp == 5 * 5120 and d.target_layers == [2, 17, 32, 47, 62]
    assert d.swa_window == 2048 and d.swa_layers == [True, True, True, True, False]
    assert d.weight_bytes == pytest.approx(1.03e9, rel=0.02)  # "~1 GB" Q4_K_M drafter
    assert shaped["dflash-iq4"].weight_bytes == pytest.approx(0.92e9, rel=0.02)


def test_dense_and_moe_sizes_match_published_files(shaped):
    assert shaped["32b"].file_bytes == pytest.approx(19.76e9, rel=0.005)
    assert shaped["0.6b"].file_bytes == pytest.approx(0.639e9, rel=0.02)
    assert shaped["0.6b"].tied_head_bytes > 0
    moe = shaped["moe"]
    assert moe.file_bytes == pytest.approx(18.6e9, rel=0.01)
    assert (moe.n_expert, moe.n_expert_used, moe.n_ff_exp) == (128, 8, 768)
    assert moe.is_moe and sum(moe.expert_bytes) / moe.weight_bytes > 0.9


def test_unknown_arch_warns_and_reads_kv_from_tensor_shapes(tmp_path):
    spec = ModelSpec("mystery", "Mystery-1B", n_layer=4, n_embd=1024, n_ff=2816, n_head=16, n_head_kv=4,
                     head_dim=64, n_vocab=32000, n_ctx_train=8192)
    m = read_meta(write_shaped(tmp_path / "m.gguf", spec, "Q8_0"))
    assert not m.known_arch and "unknown architecture 'mystery'" in m.warnings[0]
    assert [(k.n_embd_k, k.n_embd_v) for k in m.kv_layers()] == [(256, 256)] * 4


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(LocalflashError, match="not a (readable )?GGUF"):
        read_meta(bad)
    with pytest.raises(LocalflashError, match="not found"):
        read_meta(tmp_path / "missing.gguf")


def test_shaped_file_is_sparse(tmp_path):
    path = write_preset(tmp_path, "qwen3-32b", "Q4_K_M")
    assert path.stat().st_size > 19e9
    assert path.stat().st_blocks * 512 < 64 * 1024**2  # a header on disk, the rest a hole


def test_presets_cover_the_planned_pairs():
    assert {"qwen3.6-27b", "qwen3.6-27b-dflash", "qwen3-32b", "qwen3-0.6b", "qwen3-30b-a3b"} <= set(PRESETS)
