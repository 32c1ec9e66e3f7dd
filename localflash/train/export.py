"""A trained PyTorch drafter out to llama.cpp (GGUF, quantized) or to an HF checkpoint.

Both go through :mod:`localflash.formats.dflash_hf`'s name map and writers, so a drafter
made here and a converted z-lab checkpoint are written by the same code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from localflash.formats.dflash_gguf import DrafterInfo, write_quantized
from localflash.formats.dflash_hf import hf_config, hf_to_gguf_name
from localflash.formats.safetensors import write_safetensors
from localflash.train.model import DFlashDraft


def gguf_tensors(model: DFlashDraft) -> dict[str, np.ndarray]:
    """The drafter's GGUF tensors: its own weights, plus head and ``d2t`` for a reduced vocabulary."""
    out = {hf_to_gguf_name(k): v for k, v in model.hf_state().items()}
    if model.d2t is not None:
        out["output.weight"] = model.head.detach().float().cpu().numpy()
        out["d2t"] = model.d2t.detach().cpu().numpy().astype(np.int64)
    return out


def export_gguf(
    model: DFlashDraft,
    out: str | Path,
    target: str | Path,
    quant: str = "Q8_0",
    n_target_layers: int | None = None,
    name: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Path:
    """Write the drafter as a ``dflash`` GGUF for ``target`` (tokenizer copied from it)."""
    return write_quantized(out, model.spec, gguf_tensors(model), target, quant, name=name,
                           n_target_layers=n_target_layers, on_stage=on_stage)


def export_hf(model: DFlashDraft, out_dir: str | Path, n_target_layers: int | None = None, dtype: str = "bf16") -> Path:
    """Write the drafter as an HF checkpoint (config.json + model.safetensors) for vLLM/SGLang."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = dict(model.hf_state())
    draft_vocab = None
    if model.d2t is not None:
        d2t = model.d2t.detach().cpu().numpy().astype(np.int64)
        draft_vocab = int(d2t.size)
        tensors["lm_head.weight"] = model.head.detach().float().cpu().numpy()
        tensors["d2t"] = d2t - np.arange(d2t.size, dtype=np.int64)
        t2d = np.zeros(model.n_vocab, np.bool_)
        t2d[d2t] = True
        tensors["t2d"] = t2d
    write_safetensors(out / "model.safetensors", tensors, dtype)
    cfg = hf_config(DrafterInfo(model.spec, model.n_vocab, n_target_layers, draft_vocab))
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out
