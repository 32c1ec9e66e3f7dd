"""DSpark drafters from Hugging Face checkpoints to llama.cpp ``dflash`` GGUF files.

A DSpark drafter is a DFlash drafter plus a low-rank Markov head (the token
chosen before each block position biases that position's logits) and an
optional confidence head (where to cut the draft). The public checkpoint
format, as read here:

- Hugging Face ``DSparkDraftModel`` checkpoints (e.g. ``satgeze/Qwen3.6-27B-DSpark``;
  also ``Qwen3DSparkModel``, ``DSparkSpeculator``, ``Lfm2DSparkDraftModel``,
  ``LingDSparkModel``), served by vLLM's ``qwen3_dspark.py``;
- llama.cpp's converter, ``conversion/qwen.py`` ``DSparkModel`` (vendored in
  llama-cpp-python 0.3.36, llama.cpp 0c1e570), with the tensor map in
  ``gguf-py/gguf/tensor_mapping.py`` and the loader in ``src/models/dflash.cpp``.
  We follow its names and keys; the code is our own.

The checkpoint is a DFlash one (``config.json`` with a Qwen3 decoder config,
safetensors with ``fc``, ``hidden_norm``, ``norm``, ``layers.N.*``; see
:mod:`localflash.formats.dflash_hf`) plus, ``model.``-prefixed or not:

- ``markov_head.markov_w1.weight`` ``[vocab, rank]`` -> ``markov_w1.weight``
  (the previous token's low-rank embedding);
- ``markov_head.markov_w2.weight`` ``[draft_vocab, rank]`` -> ``markov_w2.weight``
  (its projection to a logit bias);
- ``confidence_head.proj.weight`` ``[1, hidden + rank]`` and ``.bias`` ``[1]``
  -> ``conf_proj.*`` (optional: vanilla-Markov exports ship without it).

Config: ``markov_head_type`` must be ``vanilla`` (the only one llama.cpp runs);
two schemas give the taps: DFlash's (``dflash_config`` or top-level
``target_layer_ids`` / ``mask_token_id``, HF ids: the GGUF gets id + 1) and the
speculators/EAGLE-3 one (``transformer_layer_config`` with the decoder,
``aux_hidden_state_layer_ids`` already in llama.cpp's layer-input convention).
``sample_from_anchor`` (anchor-first block) defaults to true for the DFlash
schema and false for the EAGLE-3 one (its 1+N bonus-anchor block). The GGUF
gets ``dflash.sample_from_anchor`` and ``dflash.has_confidence_head``. With a
full vocabulary the drafter's ``lm_head`` is dropped (the target's head is
used, as llama.cpp's converter does); a reduced one keeps it and its ``d2t``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import numpy as np

from localflash.errors import LocalflashError
from localflash.formats.dflash_gguf import (
    QUANTS,
    DFlash2Spec,
    DFlashSpec,
    DrafterInfo,
    DSparkSpec,
    LazyTensor,
    check_against_target,
    read_target,
    write_quantized,
)
from localflash.formats.dflash_hf import (
    Checkpoint,
    _check_tensors,
    _d2t_loader,
    _loader,
    hf_to_gguf_name,
    read_checkpoint,
    spec_from_hf,
)
from localflash.formats.dflash_hf import hf_to_gguf as dflash_hf_to_gguf

DSPARK_TENSORS = {  # HF name (without "model.") -> GGUF name
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
}


def is_dspark(config: dict) -> bool:
    return any("dspark" in str(a).lower() for a in config.get("architectures") or [])


def dflash_config(config: dict) -> tuple[dict, bool]:
    """The DSpark config in DFlash's schema (nested ``dflash_config``), and ``sample_from_anchor``."""
    anchor = config.get("sample_from_anchor")
    if anchor is None:
        anchor = "transformer_layer_config" not in config and "aux_hidden_state_layer_ids" not in config
    c = {**config, **(config.get("transformer_layer_config") or {})}
    kind = c.pop("markov_head_type", None) or "vanilla"
    if kind != "vanilla":
        raise LocalflashError(f"DSpark markov_head_type {kind!r} is not supported", hint="llama.cpp runs vanilla Markov heads only")
    if "aux_hidden_state_layer_ids" in c:
        taps = {"mask_token_id": c.get("mask_token_id"), "target_layer_ids": [int(i) - 1 for i in c["aux_hidden_state_layer_ids"]]}
    else:
        taps = {k: c[k] for k in ("target_layer_ids", "mask_token_id") if k in c}
    c.setdefault("dflash_config", taps)
    return c, bool(anchor)


def _names(ckpt: Checkpoint) -> dict[str, str]:
    return {n.removeprefix("model."): n for n in ckpt.files}


def dspark_info(ckpt: Checkpoint) -> DrafterInfo:
    """A :class:`DSparkSpec` (llama.cpp conventions) from a DSpark checkpoint's config and head shapes."""
    config, anchor = dflash_config(ckpt.config)
    base = spec_from_hf(config, ckpt)
    if isinstance(base.spec, DFlash2Spec):
        raise LocalflashError("this DSpark checkpoint has DFlash2 convolution keys", hint="DSpark drafters are DFlash + Markov head")
    have = _names(ckpt)
    if "markov_head.markov_w1.weight" not in have or "markov_head.markov_w2.weight" not in have:
        raise LocalflashError("the DSpark checkpoint lacks markov_head.markov_w1/markov_w2", hint="is a shard missing?")
    w1 = ckpt.shape(have["markov_head.markov_w1.weight"])
    if len(w1) != 2:
        raise LocalflashError(f"markov_head.markov_w1.weight has shape {list(w1)}, expected [vocab, rank]")
    kept = {f.name: getattr(base.spec, f.name) for f in fields(DFlashSpec)}
    spec = DSparkSpec(**kept, markov_rank=int(w1[1]), confidence="confidence_head.proj.weight" in have, sample_from_anchor=anchor)
    return DrafterInfo(spec, base.vocab_size, base.n_target_layers, base.draft_vocab_size)


def _check_heads(ckpt: Checkpoint, info: DrafterInfo) -> None:
    s = info.spec
    assert isinstance(s, DSparkSpec)
    vocab = info.vocab_size or None
    want: dict[str, tuple] = {
        "markov_head.markov_w1.weight": (vocab, s.markov_rank),
        "markov_head.markov_w2.weight": (info.draft_vocab_size or vocab, s.markov_rank),
    }
    if s.confidence:
        want["confidence_head.proj.weight"] = (1, s.n_embd + s.markov_rank)
    have = _names(ckpt)
    if "confidence_head.proj.bias" in have:
        if not s.confidence:
            raise LocalflashError("the checkpoint has confidence_head.proj.bias but no confidence_head.proj.weight")
        want["confidence_head.proj.bias"] = (1,)
    for name, shape in want.items():
        got = ckpt.shape(have[name])
        if len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got)):
            raise LocalflashError(f"tensor {name} has shape {list(got)}, the config implies {list(shape)}")


def _gguf_name(name: str, reduced_vocab: bool) -> str | None:
    """GGUF name of a DSpark checkpoint tensor; None for those llama.cpp does not load."""
    short = name.removeprefix("model.")
    if short in DSPARK_TENSORS:
        return DSPARK_TENSORS[short]
    if short == "lm_head.weight" and not reduced_vocab:
        return None  # a full-vocabulary drafter uses the target's head
    if re.match(r"(markov_head|confidence_head)\.", short):
        raise LocalflashError(f"unexpected DSpark tensor {short!r}", hint="DSpark heads are markov_w1, markov_w2 and confidence_head.proj")
    return hf_to_gguf_name(name)


def dspark_to_gguf(
    ckpt: Checkpoint,
    out: str | Path,
    target: str | Path,
    quant: str = "Q4_K_M",
    on_tensor: Callable[[str, int, int], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Path:
    """Convert an opened HF DSpark checkpoint to a (quantized) ``dflash`` GGUF for ``target``."""
    quant = quant.upper()
    if quant not in QUANTS:
        raise LocalflashError(f"unknown --quant {quant!r}", hint=f"use one of {', '.join(QUANTS)}")
    info = dspark_info(ckpt)
    tgt = read_target(target)
    _check_tensors(ckpt, info)
    _check_heads(ckpt, info)
    fc_name = _names(ckpt)["fc.weight"]
    check_against_target(info, tgt, fc_in=ckpt.shape(fc_name)[1])
    reduced = info.draft_vocab_size is not None
    names = [(n, g) for n in ckpt.files if (g := _gguf_name(n, reduced)) is not None]
    tensors: dict[str, LazyTensor] = {}
    n_params = 0
    for k, (hf_name, g) in enumerate(names):
        shape = ckpt.shape(hf_name)
        n_params += int(np.prod(shape))
        if g == "d2t":
            tensors[g] = LazyTensor((int(np.prod(shape)),), _d2t_loader(ckpt, hf_name, tgt.n_vocab, info.draft_vocab_size), integer=True)
        else:
            tensors[g] = LazyTensor(shape, _loader(ckpt, hf_name, g, k, len(names), on_tensor))
    return write_quantized(out, info.spec, tensors, tgt.path, quant, name=ckpt.dir.name,
                           n_target_layers=info.n_target_layers, n_params=n_params, on_stage=on_stage)


def hf_to_gguf(
    hf_dir: str | Path,
    out: str | Path,
    target: str | Path,
    quant: str = "Q4_K_M",
    on_tensor: Callable[[str, int, int], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Path:
    """Convert an HF drafter folder, DSpark or DFlash/DFlash2, to a (quantized) ``dflash`` GGUF for ``target``."""
    ckpt = read_checkpoint(hf_dir, dspark_ok=True)
    if not is_dspark(ckpt.config):
        return dflash_hf_to_gguf(hf_dir, out, target, quant, on_tensor=on_tensor, on_stage=on_stage)
    return dspark_to_gguf(ckpt, out, target, quant, on_tensor=on_tensor, on_stage=on_stage)


def checkpoint_info(hf_dir: str | Path) -> DrafterInfo:
    """The drafter an HF checkpoint folder holds: DSpark or DFlash/DFlash2."""
    ckpt = read_checkpoint(hf_dir, dspark_ok=True)
    return dspark_info(ckpt) if is_dspark(ckpt.config) else spec_from_hf(ckpt.config, ckpt)
