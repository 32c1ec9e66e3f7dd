"""DFlash drafters between Hugging Face checkpoints and llama.cpp GGUF files.

A z-lab style checkpoint is ``config.json`` (``DFlashDraftModel``, a Qwen3
decoder config plus ``dflash_config``) and safetensors with top-level names
(``fc``, ``hidden_norm``, ``norm``, ``layers.N.*``) and no embedding or LM
head: those are the target's. llama.cpp's ``dflash`` arch wants the same
weights under GGUF names, the tokenizer of the target, and:

- ``dflash.target_layers``: the HF ``target_layer_ids`` **plus one**, because
  llama.cpp taps layer *inputs* (the input of layer i+1 is the output of
  layer i, which is what ``hidden_states[i + 1]`` holds in Transformers);
- ``dflash.block_size``, ``tokenizer.ggml.mask_token_id``;
- ``attention.sliding_window`` + ``dflash.attention.sliding_window_pattern``
  for sliding layers, ``dflash.attention.causal`` only when the checkpoint
  says so (llama.cpp has one causal flag for all layers: without it every
  layer, sliding ones included, is bidirectional inside the block);
- rope theta/scaling, RMS-norm epsilon, head sizes.

Reduced-vocabulary drafters carry their own ``lm_head`` and a ``d2t`` map;
HF (speculators) stores ``d2t`` as offsets (target = draft + d2t[draft]),
GGUF as absolute target ids.

The GGUF side is :mod:`localflash.formats.dflash_gguf`; safetensors are read
and written with NumPy (:mod:`localflash.formats.safetensors`), so conversion
needs neither torch nor transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localflash.errors import LocalflashError
from localflash.formats.dflash_gguf import (
    DFLASH2_KEYS,
    QUANTS,
    DFlash2Spec,
    DFlashSpec,
    DrafterInfo,
    LazyTensor,
    check_against_target,
    read_dflash_gguf,
    read_target,
    write_quantized,
)
from localflash.formats.safetensors import SafetensorsFile, write_safetensors

HF_DTYPES = ("bf16", "f16", "f32")

_TOP = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "embed_tokens.weight": "token_embd.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# DFlash2 (z-lab/inco.ai ``DFlash2DraftModel``): two-tap dynamic convolutions per layer, a candidate selector
_TOP_DFLASH2 = {
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",  # stored without ".weight"
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}
_LAYER_DFLASH2 = {
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
_TOP.update(_TOP_DFLASH2)
_LAYER.update(_LAYER_DFLASH2)
_GGUF_TOP = {v: k for k, v in _TOP.items()}
_GGUF_LAYER = {v: k for k, v in _LAYER.items()}
# keys of DFlash variants this converter does not handle (DSpark, Gemma knobs)
_UNSUPPORTED = {
    "markov_head_type": "a DSpark checkpoint",
    "output_multiplier": "an output multiplier (Gemma targets)",
    "final_logit_softcapping": "logit softcapping (Gemma targets)",
    "attention_sink_bias": "attention sinks",
    "attention_value_scale": "an attention value scale",
    "partial_rotary_factor": "partial rotary embeddings",
}


def build_target_layer_ids(n_target_layers: int, n_feats: int) -> list[int]:
    """z-lab's default taps (HF convention): spread between layer 1 and layer N-3."""
    if n_feats == 1:
        return [n_target_layers // 2]
    start, end = 1, n_target_layers - 3
    return [int(round(start + i * (end - start) / (n_feats - 1))) for i in range(n_feats)]


def hf_to_gguf_name(name: str) -> str | None:
    """GGUF name of an HF drafter tensor; None for tensors llama.cpp does not use (t2d)."""
    name = name.removeprefix("model.")
    if name.removesuffix(".weight") in _TOP_DFLASH2:  # codebooks saved either way
        name = name.removesuffix(".weight") if name.endswith("codebook.weight") else name
    if name in _TOP:
        return _TOP[name]
    if name in ("d2t",):
        return "d2t"
    if name == "t2d":
        return None
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}"
    raise LocalflashError(
        f"unexpected tensor {name!r} in the checkpoint",
        hint="convert-drafter handles DFlash and DFlash2 drafters: fc, hidden_norm, norm, Qwen3 decoder layers (+ conv, selector)",
    )


def gguf_to_hf_name(name: str) -> str:
    if name in _GGUF_TOP:
        return _GGUF_TOP[name]
    if name == "d2t":
        return "d2t"
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m.group(2) in _GGUF_LAYER:
        return f"layers.{m.group(1)}.{_GGUF_LAYER[m.group(2)]}"
    raise LocalflashError(f"unexpected tensor {name!r} in the GGUF drafter", hint="--to-hf handles DFlash and DFlash2 drafters")


@dataclass
class Checkpoint:
    """An HF drafter directory: its config and lazily loaded tensors."""

    dir: Path
    config: dict
    files: dict[str, SafetensorsFile]  # tensor name -> file holding it

    def shape(self, name: str) -> tuple[int, ...]:
        return self.files[name].shape(name)

    def get(self, name: str) -> np.ndarray:
        return self.files[name].get(name)


def read_checkpoint(hf_dir: str | Path, dspark_ok: bool = False) -> Checkpoint:
    """Open an HF drafter directory; every listed shard must be present (``dspark_ok``: DSpark ones too)."""
    d = Path(hf_dir).expanduser()
    if not d.is_dir():
        raise LocalflashError(f"not a directory: {d}", hint="pass the folder holding config.json and *.safetensors")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise LocalflashError(f"{d} has no config.json", hint="pass a Hugging Face checkpoint folder")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LocalflashError(f"{cfg_path} is not valid JSON ({e.msg} at line {e.lineno})") from e
    check_is_dflash(config, d, dspark_ok)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (d / s).is_file()]
        if missing:
            raise LocalflashError(
                f"missing safetensors shard {missing[0]} (listed in {index.name}; {len(missing)} of {len(shards)} missing)",
                hint="download the whole checkpoint folder",
            )
    else:
        shards = sorted(p.name for p in d.glob("*.safetensors"))
        if not shards:
            bins = list(d.glob("*.bin"))
            raise LocalflashError(
                f"no safetensors weights in {d}" + (" (only PyTorch .bin files)" if bins else ""),
                hint="convert-drafter reads *.safetensors checkpoints",
            )
    files: dict[str, SafetensorsFile] = {}
    for shard in shards:
        st = SafetensorsFile(d / shard)
        for name in st.keys():
            files[name] = st
    if index.is_file():
        absent = [n for n in weight_map if n not in files]
        if absent:
            raise LocalflashError(f"tensor {absent[0]} is listed in {index.name} but missing from its shard")
    return Checkpoint(d, config, files)


def check_is_dflash(config: dict, where: Path | str, dspark_ok: bool = False) -> None:
    archs = config.get("architectures") or []
    if any("dspark" in str(a).lower() for a in archs):  # DSparkDraftModel, Qwen3DSparkModel, Lfm2DSparkDraftModel, ...
        if dspark_ok:
            return  # checked by localflash.formats.dspark_hf
        raise LocalflashError(f"{where} is a DSpark checkpoint ({', '.join(map(str, archs))}), which convert-drafter does not convert",
                              hint="convert it with localflash.formats.dspark_hf.hf_to_gguf (what convert-drafter runs)")
    if not any("dflash" in str(a).lower() for a in archs) and "dflash_config" not in config:
        what = ", ".join(map(str, archs)) or config.get("model_type") or "unknown"
        raise LocalflashError(
            f"{where} is not a DFlash drafter checkpoint (architecture: {what})",
            hint="convert-drafter converts DFlash drafters (config.json with dflash_config); for a draft model use a GGUF of it with --spec draft",
        )
    dcfg = config.get("dflash_config") or {}
    for key, what in _UNSUPPORTED.items():
        if config.get(key) is not None or dcfg.get(key) is not None:
            raise LocalflashError(f"{where} is {what}, which this converter does not handle", hint="DFlash and DFlash2 drafters are supported")


# -- config <-> spec --------------------------------------------------------------------------
def spec_from_hf(config: dict, ckpt: Checkpoint | None = None) -> DrafterInfo:
    """A :class:`DFlashSpec` (llama.cpp conventions) from an HF drafter config."""
    c = {**config, **(config.get("text_config") or {})}
    d = c.get("dflash_config") or {}
    try:
        hidden = int(c["hidden_size"])
        n_layer = int(c["num_hidden_layers"])
        n_head = int(c["num_attention_heads"])
        ff = int(c["intermediate_size"])
    except KeyError as e:
        raise LocalflashError(f"config.json lacks {e.args[0]}", hint="is this a complete DFlash drafter config?") from e
    n_head_kv = int(c.get("num_key_value_heads") or n_head)
    head_dim = int(c.get("head_dim") or hidden // n_head)
    if (act := c.get("hidden_act", "silu")) != "silu":
        raise LocalflashError(f"hidden_act {act!r} is not supported (silu is)")
    if c.get("attention_bias"):
        raise LocalflashError("attention_bias is not supported by the dflash arch")
    mask = d.get("mask_token_id", c.get("mask_token_id"))
    if mask is None:
        raise LocalflashError("config.json names no dflash_config.mask_token_id", hint="DFlash drafters need their mask token id")
    ids = d.get("target_layer_ids", c.get("target_layer_ids"))
    n_target = c.get("num_target_layers")
    if not ids:
        fc = next((n for n in (ckpt.files if ckpt else {}) if n.removeprefix("model.") == "fc.weight"), None)
        if fc is None or n_target is None:
            raise LocalflashError("config.json names no dflash_config.target_layer_ids (and no num_target_layers to derive them)")
        ids = build_target_layer_ids(int(n_target), ckpt.shape(fc)[1] // hidden)
    rope = c.get("rope_parameters") or {}
    theta = float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    scaling = c.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
    if scaling and (scaling.get("rope_type") or scaling.get("type")) in (None, "default"):
        scaling = None
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in ("linear", "yarn"):
        raise LocalflashError(f"rope scaling {scaling.get('rope_type') or scaling.get('type')!r} is not supported (linear and yarn are)")
    layer_types = c.get("layer_types") or []
    if d.get("use_swa"):
        swa_layers = [True] * n_layer
    else:
        swa_layers = [t == "sliding_attention" for t in layer_types] if layer_types else [False] * n_layer
    if len(swa_layers) != n_layer:
        raise LocalflashError(f"layer_types has {len(swa_layers)} entries for {n_layer} layers")
    window = int(d.get("swa_window_size") or c.get("sliding_window") or 0) if any(swa_layers) else 0
    if any(swa_layers) and not window:
        raise LocalflashError("config.json has sliding_attention layers but no sliding_window size")
    causal = c.get("is_causal")
    if causal is None:
        causal = d.get("causal")
    dflash2 = {k: int(d[k]) for k in DFLASH2_KEYS if d.get(k) is not None}
    if dflash2 and len(dflash2) != len(DFLASH2_KEYS):
        missing = [k for k in DFLASH2_KEYS if k not in dflash2]
        raise LocalflashError(f"config.json is a DFlash2 drafter without dflash_config.{missing[0]}", hint=f"DFlash2 needs {', '.join(DFLASH2_KEYS)}")
    spec = (DFlash2Spec if dflash2 else DFlashSpec)(
        **dflash2,
        n_embd=hidden,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=ff,
        target_layers=[int(i) + 1 for i in ids],
        block_size=int(d.get("block_size") or c.get("block_size") or 16),
        mask_token_id=int(mask),
        rope_theta=theta,
        swa_window=window,
        swa_layers=swa_layers if window else None,
        n_ctx_train=int(c.get("max_position_embeddings") or 4096),
        rms_eps=float(c.get("rms_norm_eps") or 1e-6),
        causal=None if causal is None else bool(causal),
        key_length=head_dim if head_dim != hidden // n_head else None,
        rope_scaling=dict(scaling) if scaling else None,
        embedding_scale=float(d.get("input_embedding_scale", c.get("input_embedding_scale")) or 0.0),
    )
    vocab = int(c.get("vocab_size") or 0)
    draft_vocab = c.get("draft_vocab_size")
    return DrafterInfo(spec, vocab, None if n_target is None else int(n_target), int(draft_vocab) if draft_vocab and int(draft_vocab) != vocab else None)


def hf_config(info: DrafterInfo) -> dict:
    """An HF ``config.json`` for a drafter (z-lab layout, what vLLM and SGLang load)."""
    s = info.spec
    dcfg: dict = {"mask_token_id": s.mask_token_id, "target_layer_ids": [i - 1 for i in s.target_layers], "block_size": s.block_size}
    dcfg.update(s.dflash2_keys() if isinstance(s, DFlash2Spec) else {})
    if s.causal is not None:
        dcfg["causal"] = s.causal
    if s.embedding_scale:
        dcfg["input_embedding_scale"] = s.embedding_scale
    cfg = {
        "architectures": ["DFlash2DraftModel" if isinstance(s, DFlash2Spec) else "DFlashDraftModel"],
        "auto_map": {"AutoModel": f"dflash.{'DFlash2' if isinstance(s, DFlash2Spec) else 'DFlash'}DraftModel"},
        "model_type": "qwen3",
        "hidden_size": s.n_embd,
        "intermediate_size": s.ff,
        "num_attention_heads": s.n_head,
        "num_key_value_heads": s.n_head_kv,
        "head_dim": s.head_dim,
        "num_hidden_layers": s.n_layer,
        "block_size": s.block_size,
        "dflash_config": dcfg,
        "layer_types": ["sliding_attention" if s.swa_window and (s.swa_layers or [True] * s.n_layer)[i] else "full_attention" for i in range(s.n_layer)],
        "rope_theta": s.rope_theta,
        "rope_scaling": s.rope_scaling,
        "max_position_embeddings": s.n_ctx_train,
        "rms_norm_eps": s.rms_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": info.vocab_size,
    }
    if info.n_target_layers is not None:
        cfg["num_target_layers"] = info.n_target_layers
    if s.swa_window:
        cfg["sliding_window"] = s.swa_window
        cfg["use_sliding_window"] = True
    if info.draft_vocab_size:
        cfg["draft_vocab_size"] = info.draft_vocab_size
    return cfg


# -- HF -> GGUF ---------------------------------------------------------------------------------
def _check_tensors(ckpt: Checkpoint, info: DrafterInfo) -> None:
    s = info.spec
    hd = s.head_dim
    want = {
        "fc.weight": (s.n_embd, None),
        "hidden_norm.weight": (s.n_embd,),
        "norm.weight": (s.n_embd,),
    }
    for i in range(s.n_layer):
        p = f"layers.{i}."
        want.update({
            p + "input_layernorm.weight": (s.n_embd,),
            p + "post_attention_layernorm.weight": (s.n_embd,),
            p + "self_attn.q_proj.weight": (s.n_head * hd, s.n_embd),
            p + "self_attn.k_proj.weight": (s.n_head_kv * hd, s.n_embd),
            p + "self_attn.v_proj.weight": (s.n_head_kv * hd, s.n_embd),
            p + "self_attn.o_proj.weight": (s.n_embd, s.n_head * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (s.ff, s.n_embd),
            p + "mlp.up_proj.weight": (s.ff, s.n_embd),
            p + "mlp.down_proj.weight": (s.n_embd, s.ff),
        })
        if isinstance(s, DFlash2Spec):
            k, proj = s.conv_kernel_size, 2 * s.conv_kernel_size * (s.n_embd // s.conv_group_size)
            for conv in ("attention_conv", "mlp_conv"):
                want[p + conv + ".base_kernel"] = (2, k, s.n_embd)
                want[p + conv + ".kernel_projection.weight"] = (proj, s.n_embd)
    have = {n.removeprefix("model."): n for n in ckpt.files}
    if isinstance(s, DFlash2Spec):
        for n in list(have):
            if n.endswith("codebook.weight"):
                have[n.removesuffix(".weight")] = have.pop(n)
        want["candidate_selector.predecessor_codebook"] = (info.vocab_size or None, s.selector_rank)
        want["candidate_selector.successor_codebook"] = (info.vocab_size or None, s.selector_rank)
        want["candidate_selector.hidden_projection.weight"] = (s.selector_rank, s.n_embd)
    for name, shape in want.items():
        if name not in have:
            raise LocalflashError(f"the checkpoint lacks tensor {name}", hint="is a shard missing, or is this not a DFlash drafter?")
        got = ckpt.shape(have[name])
        if len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got)):
            raise LocalflashError(f"tensor {name} has shape {list(got)}, the config implies {[w for w in shape]}")
    extra_layers = {int(m.group(1)) for n in have if (m := re.match(r"layers\.(\d+)\.", n))} - set(range(s.n_layer))
    if extra_layers:
        raise LocalflashError(f"the checkpoint has layer {min(extra_layers)} but config.json says {s.n_layer} layers")
    if info.draft_vocab_size:
        for name in ("lm_head.weight", "d2t"):
            if name not in have:
                raise LocalflashError(f"draft_vocab_size is {info.draft_vocab_size} but the checkpoint has no {name}")


def hf_to_gguf(
    hf_dir: str | Path,
    out: str | Path,
    target: str | Path,
    quant: str = "Q4_K_M",
    on_tensor: Callable[[str, int, int], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Path:
    """Convert an HF DFlash drafter to a (quantized) ``dflash`` GGUF for ``target``."""
    quant = quant.upper()
    if quant not in QUANTS:
        raise LocalflashError(f"unknown --quant {quant!r}", hint=f"use one of {', '.join(QUANTS)}")
    ckpt = read_checkpoint(hf_dir)
    info = spec_from_hf(ckpt.config, ckpt)
    tgt = read_target(target)
    _check_tensors(ckpt, info)
    fc_name = next(n for n in ckpt.files if n.removeprefix("model.") == "fc.weight")
    check_against_target(info, tgt, fc_in=ckpt.shape(fc_name)[1])

    tensors: dict[str, LazyTensor] = {}
    n_params = 0
    names = [n for n in ckpt.files if hf_to_gguf_name(n) is not None]
    total = len(names)
    for k, hf_name in enumerate(names):
        g = hf_to_gguf_name(hf_name)
        shape = ckpt.shape(hf_name)
        n_params += int(np.prod(shape))
        if g == "d2t":
            tensors[g] = LazyTensor((int(np.prod(shape)),), _d2t_loader(ckpt, hf_name, tgt.n_vocab, info.draft_vocab_size), integer=True)
        else:
            tensors[g] = LazyTensor(shape, _loader(ckpt, hf_name, g, k, total, on_tensor))
    return write_quantized(out, info.spec, tensors, tgt.path, quant, name=Path(hf_dir).name,
                           n_target_layers=info.n_target_layers, n_params=n_params, on_stage=on_stage)


def _loader(ckpt: Checkpoint, hf_name: str, g: str, k: int, total: int, on_tensor) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        arr = ckpt.get(hf_name)
        if on_tensor:
            on_tensor(g, k, total)
        return arr

    return load


def _d2t_loader(ckpt: Checkpoint, hf_name: str, n_vocab: int, draft_vocab: int | None) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        off = np.asarray(ckpt.get(hf_name)).astype(np.int64).reshape(-1)
        if draft_vocab and off.size != draft_vocab:
            raise LocalflashError(f"d2t has {off.size} entries but draft_vocab_size is {draft_vocab}")
        ids = off + np.arange(off.size, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= n_vocab or np.unique(ids).size != ids.size:
            raise LocalflashError("d2t maps draft tokens outside the target vocabulary, or twice to one token")
        return ids

    return load


# -- GGUF -> HF ---------------------------------------------------------------------------
def gguf_to_hf(path: str | Path, out_dir: str | Path, dtype: str = "bf16", on_stage: Callable[[str], None] | None = None) -> Path:
    """Write a ``dflash`` GGUF as an HF checkpoint (config.json + model.safetensors)."""
    if dtype not in HF_DTYPES:
        raise LocalflashError(f"unknown --dtype {dtype!r}", hint=f"use one of {', '.join(HF_DTYPES)}")
    if on_stage:
        on_stage("reading GGUF")
    info, tensors = read_dflash_gguf(path)
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise LocalflashError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    hf: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        hname = gguf_to_hf_name(name)
        if hname == "d2t":
            hf["d2t"] = arr - np.arange(arr.size, dtype=np.int64)  # speculators: offsets
            t2d = np.zeros(info.vocab_size, np.bool_)
            t2d[arr] = True
            hf["t2d"] = t2d
        else:
            hf[hname] = arr
    if on_stage:
        on_stage(f"writing {dtype} safetensors")
    write_safetensors(out / "model.safetensors", hf, dtype)
    cfg = hf_config(info)
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out
