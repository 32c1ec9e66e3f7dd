"""Tiny random-weight GGUF files for tests, benchmarks and device checks.

Every file carries a real tokenizer (llama.cpp's SentencePiece vocab from the
0.3.36 sdist, MIT) so text goes in and out as usual. Weights are deterministic
by seed; a drafter made from the target's seed plus Gaussian ``noise`` agrees
with the target more or less often (0 noise: always, 0.6: rarely).

Architectures: ``llama`` and ``qwen3`` targets (both export layer inputs, so
DFlash can tap them); ``dflash``, DFlash2 and DSpark drafters in the real file format
(:mod:`localflash.formats.dflash_gguf`) with random weights; ``eagle3``
drafters (``src/models/eagle3.cpp``); ``qwen35`` and ``qwen3next`` hybrids
(Gated-DeltaNet + full attention, optionally with an MTP "nextn" block) by
:func:`write_hybrid`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from localflash.formats.dflash_gguf import DFlash2Spec, DFlashSpec, DSparkSpec, write_dflash_gguf
from localflash.formats.gguf_write import add_decoder_keys, add_expert_keys, add_ssm_keys, copy_tokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_NOISE_SEED = 12345


def vocab_path() -> Path:
    return Path(str(resources.files("localflash") / "data" / "ggml-vocab-llama-spm.gguf"))


class _Widths:
    """``head_dim`` and ``ff`` of a spec with ``n_embd``, ``n_head`` and an optional ``n_ff``."""

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ff(self) -> int:
        return self.n_ff or 4 * self.n_embd


@dataclass
class TinySpec(_Widths):
    """Shape of a tiny decoder. ``arch`` is ``llama`` or ``qwen3``."""

    arch: str = "llama"
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int | None = None
    n_ctx_train: int = 4096
    seed: int = 0
    noise: float = 0.0
    rename_tokens: bool = False  # write a vocab whose token strings differ (incompatible pair)
    layer_scale: float = 0.02  # std of the layer matrices; larger makes each layer change the residual more


class _Weights:
    """Deterministic weights: base from ``seed``, plus ``noise`` from a fixed stream."""

    def __init__(self, seed: int, noise: float):
        self.rng = np.random.default_rng(seed)
        self.nrng = np.random.default_rng(_NOISE_SEED)
        self.noise = noise

    def __call__(self, shape: tuple[int, ...], scale: float) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        if self.noise:
            w = w + self.noise * self.nrng.standard_normal(shape, dtype=np.float32)
        return (w * scale).astype(np.float32)


def _ones(n: int) -> np.ndarray:
    return np.ones(n, np.float32)


def _attention(rand: _Weights, b: str, spec, s: float, *, d_in: int | None = None, q_mult: int = 1,
               qk_norm: bool = False) -> dict[str, np.ndarray]:
    """Q/K/V/output projections of block prefix ``b`` (``q_mult`` 2: the query also yields the output gate)."""
    d, hd = spec.n_embd, spec.head_dim
    d_in = d_in or d
    t = {
        b + "attn_q.weight": rand((q_mult * spec.n_head * hd, d_in), s),
        b + "attn_k.weight": rand((spec.n_head_kv * hd, d_in), s),
        b + "attn_v.weight": rand((spec.n_head_kv * hd, d_in), s),
        b + "attn_output.weight": rand((d, spec.n_head * hd), s),
    }
    if qk_norm:
        t[b + "attn_q_norm.weight"] = _ones(hd)
        t[b + "attn_k_norm.weight"] = _ones(hd)
    return t


def _ffn(rand: _Weights, b: str, d: int, ff: int, s: float, suffix: str = "") -> dict[str, np.ndarray]:
    """A SwiGLU feed-forward (``suffix`` ``_shexp``: the shared expert)."""
    return {
        b + f"ffn_gate{suffix}.weight": rand((ff, d), s),
        b + f"ffn_up{suffix}.weight": rand((ff, d), s),
        b + f"ffn_down{suffix}.weight": rand((d, ff), s),
    }


def _decoder_block(rand: _Weights, b: str, spec, s: float, qk_norm: bool) -> dict[str, np.ndarray]:
    """A Llama/Qwen3 block: norm, attention, norm, feed-forward."""
    d = spec.n_embd
    return {b + "attn_norm.weight": _ones(d), **_attention(rand, b, spec, s, qk_norm=qk_norm),
            b + "ffn_norm.weight": _ones(d), **_ffn(rand, b, d, spec.ff, s)}


def _finish(w: GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_target(path: str | Path, spec: TinySpec | None = None, **kw) -> Path:
    """Write a tiny ``llama`` or ``qwen3`` model with random F32 weights."""
    spec = spec or TinySpec(**kw)
    path = Path(path)
    arch = spec.arch
    if arch not in ("llama", "qwen3"):
        raise ValueError(f"tiny targets are llama or qwen3, not {arch}")
    qwen3 = arch == "qwen3"
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{spec.n_embd}x{spec.n_layer}-s{spec.seed}")
    n_vocab = copy_tokenizer(w, vocab_path(), spec.rename_tokens)
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)
    add_decoder_keys(w, n_ctx_train=spec.n_ctx_train, n_embd=spec.n_embd, n_block=spec.n_layer, n_ff=spec.ff,
                     n_head=spec.n_head, n_head_kv=spec.n_head_kv, rms_eps=1e-5, head_dim=spec.head_dim if qwen3 else None,
                     rope_theta=1e6 if qwen3 else None, n_rot=None if qwen3 else spec.head_dim, n_vocab=n_vocab)
    w.add_file_type(0)  # ALL_F32

    rand = _Weights(spec.seed, spec.noise)
    d = spec.n_embd
    t = {"token_embd.weight": rand((n_vocab, d), 1.0), "output_norm.weight": _ones(d), "output.weight": rand((n_vocab, d), 0.5)}
    for i in range(spec.n_layer):
        t.update(_decoder_block(rand, f"blk.{i}.", spec, spec.layer_scale, qk_norm=qwen3))
    _finish(w, t)
    return path


def dflash_tensors(spec: DFlashSpec) -> dict[str, np.ndarray]:
    """Random DFlash drafter weights under their GGUF names (NumPy shapes, row-major)."""
    rand = _Weights(spec.seed, 0.0)
    d = spec.n_embd
    n_feat = len(spec.target_layers) * d
    t: dict[str, np.ndarray] = {
        "fc.weight": rand((d, n_feat), 1.0 / np.sqrt(n_feat)),
        "enc.output_norm.weight": _ones(d),
        "output_norm.weight": _ones(d),
    }
    for i in range(spec.n_layer):
        t.update(_decoder_block(rand, f"blk.{i}.", spec, 0.1, qk_norm=True))
    return t


def write_dflash(path: str | Path, spec: DFlashSpec | None = None, **kw) -> Path:
    """Write a tiny random DFlash drafter (borrows the target's embedding and head)."""
    spec = spec or DFlashSpec(**kw)
    return write_dflash_gguf(path, spec, dflash_tensors(spec), tokenizer_from=vocab_path())


def dflash2_tensors(spec: DFlash2Spec, n_vocab: int = 32000) -> dict[str, np.ndarray]:
    """Random DFlash2 weights: the DFlash ones plus convolutions and selector."""
    t = dflash_tensors(spec)
    rand = _Weights(spec.seed + 1000, 0.0)
    d, kernel = spec.n_embd, spec.conv_kernel_size
    projected = 2 * kernel * (d // spec.conv_group_size)
    for i in range(spec.n_layer):
        for part in ("attn", "ffn"):
            base = np.zeros((2, kernel, d), np.float32)
            base[:, 0, :] = 1.0  # tap 0 (the position itself) passes through; the others mix in neighbours
            t[f"blk.{i}.{part}_conv_base"] = base + rand((2, kernel, d), 0.1)
            t[f"blk.{i}.{part}_conv_proj.weight"] = rand((projected, d), 0.05)
    t["selector_predecessor.weight"] = rand((n_vocab, spec.selector_rank), spec.selector_scale)
    t["selector_successor.weight"] = rand((n_vocab, spec.selector_rank), spec.selector_scale)
    t["selector_hidden.weight"] = rand((spec.selector_rank, d), 1.0 / np.sqrt(d))
    return t


def write_dflash2(path: str | Path, spec: DFlash2Spec | None = None, **kw) -> Path:
    """Write a tiny random DFlash2 drafter (borrows the target's embedding and head)."""
    spec = spec or DFlash2Spec(**kw)
    return write_dflash_gguf(path, spec, dflash2_tensors(spec), tokenizer_from=vocab_path(),
                             name=f"dflash2-{spec.n_embd}x{spec.n_layer}")


def dspark_tensors(spec: DSparkSpec, n_vocab: int = 32000, agree_with: str | Path | None = None,
                   agree: float = 3.0) -> dict[str, np.ndarray]:
    """Random DSpark weights: the DFlash ones plus the Markov head and (``spec.confidence``) the confidence head.

    ``agree_with``: a tiny target GGUF whose next token follows mostly from the current one (weak layers);
    the Markov head is then that target's bigram, ``w2 = output``, ``w1 = agree x rms_norm(token_embd)``
    (rank = the target's width), so the drafts are often right: a DSpark drafter that earns acceptance.
    """
    t = dflash_tensors(spec)
    rand = _Weights(spec.seed + 2000, 0.0)
    r, d = spec.markov_rank, spec.n_embd
    if agree_with is not None:
        embd, out = _target_matrices(agree_with)
        r = embd.shape[1]
        norm = embd / np.sqrt((embd.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5)
        t["markov_w1.weight"] = (agree * norm).astype(np.float32)
        t["markov_w2.weight"] = out.astype(np.float32)
    else:
        t["markov_w1.weight"] = rand((n_vocab, r), spec.markov_scale)
        t["markov_w2.weight"] = rand((n_vocab, r), spec.markov_scale)
    if spec.confidence:
        t["conf_proj.weight"] = rand((1, d + r), 1.0 / np.sqrt(d + r))
        t["conf_proj.bias"] = np.full((1,), spec.conf_bias, np.float32)
    return t


def write_dspark(path: str | Path, spec: DSparkSpec | None = None, agree_with: str | Path | None = None, **kw) -> Path:
    """Write a tiny random DSpark drafter (a ``dflash`` file with Markov and confidence heads; see :func:`dspark_tensors`)."""
    spec = spec or DSparkSpec(**kw)
    return write_dflash_gguf(path, spec, dspark_tensors(spec, agree_with=agree_with), tokenizer_from=vocab_path(),
                             name=f"dspark-{spec.n_embd}x{spec.n_layer}")


def _target_matrices(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A tiny target's token embedding and output head, float32 ``[n_vocab, n_embd]`` (dequantized)."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(path))
    mats = {}
    for t in r.tensors:
        if t.name in ("token_embd.weight", "output.weight"):
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            data = np.asarray(t.data)
            if t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                data = dequantize(data, t.tensor_type)
            mats[t.name] = data.reshape(shape).astype(np.float32)
    return mats["token_embd.weight"], mats.get("output.weight", mats["token_embd.weight"])


@dataclass
class Eagle3Spec(_Widths):
    """A tiny EAGLE-3 drafter (arch ``eagle3``, ``src/models/eagle3.cpp``): fc over three tapped
    target layers, one decoder layer on ``[norm(token embedding), norm(g)]``.

    ``target_layers`` are layer-input ids of the target (llama.cpp's convention).
    ``draft_vocab`` > 0 gives the drafter its own head over that many target ids
    (``d2t``: every ``vocab_stride``-th id) and, with ``own_embeddings``, its own
    token embedding, so it needs nothing of the target's weights. ``echo`` > 0
    writes a drafter that is often right on a tiny target: its attention copies
    the current token's normalised embedding (query = key = ``echo`` x that
    embedding, value = it), the feed-forward is zero and ``fc_scale`` sets how
    much of the fused target features is added (0.3: mostly right, 1: mostly not).
    """

    n_embd: int = 64
    target_hidden_size: int = 64
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int | None = None
    target_layers: list[int] = field(default_factory=lambda: [1, 2, 3])
    draft_vocab: int = 0
    vocab_stride: int = 4
    own_embeddings: bool = False
    echo: float = 0.0
    fc_scale: float = 1.0
    norm_before_residual: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    n_ctx_train: int = 4096
    seed: int = 2


def eagle3_tensors(spec: Eagle3Spec, n_vocab: int = 32000) -> dict[str, np.ndarray]:
    """Random (or echoing) EAGLE-3 weights under their GGUF names (NumPy shapes, row-major)."""
    rand = _Weights(spec.seed, 0.0)
    d, hd = spec.n_embd, spec.head_dim
    n_feat = len(spec.target_layers) * spec.target_hidden_size
    q_out, kv_out = spec.n_head * hd, spec.n_head_kv * hd
    t: dict[str, np.ndarray] = {
        "fc.weight": rand((d, n_feat), spec.fc_scale / np.sqrt(n_feat)),
        "output_norm.weight": _ones(d),
        "blk.0.attn_norm.weight": _ones(d),
        "blk.0.attn_norm_2.weight": _ones(d),
        "blk.0.ffn_norm.weight": _ones(d),
    }
    if spec.echo:
        pick = np.zeros((d, 2 * d), np.float32)
        pick[:, :d] = np.eye(d, dtype=np.float32)  # the token-embedding half of the concatenated input
        t["blk.0.attn_q.weight"] = spec.echo * pick[:q_out]
        t["blk.0.attn_k.weight"] = spec.echo * pick[:kv_out]
        t["blk.0.attn_v.weight"] = pick[:kv_out]
        t["blk.0.attn_output.weight"] = np.eye(d, q_out, dtype=np.float32)
        for name, shape in (("gate", (spec.ff, d)), ("up", (spec.ff, d)), ("down", (d, spec.ff))):
            t[f"blk.0.ffn_{name}.weight"] = np.zeros(shape, np.float32)
    else:
        t.update(_attention(rand, "blk.0.", spec, 0.1, d_in=2 * d))
        t.update(_ffn(rand, "blk.0.", d, spec.ff, 0.1))
    if spec.draft_vocab:
        t["d2t"] = (np.arange(spec.draft_vocab, dtype=np.int64) * spec.vocab_stride) % n_vocab
        t["output.weight"] = rand((spec.draft_vocab, d), 0.5)
    if spec.own_embeddings:
        t["token_embd.weight"] = rand((n_vocab, d), 1.0)
    return t


def write_eagle3(path: str | Path, spec: Eagle3Spec | None = None, omit: tuple[str, ...] = (), **kw) -> Path:
    """Write a tiny EAGLE-3 drafter; ``omit`` leaves out metadata keys (for the error paths)."""
    spec = spec or Eagle3Spec(**kw)
    path = Path(path)
    w = GGUFWriter(str(path), "eagle3")
    w.add_name(f"eagle3-{spec.n_embd}")
    n_vocab = copy_tokenizer(w, vocab_path())
    add_decoder_keys(w, n_ctx_train=spec.n_ctx_train, n_embd=spec.n_embd, n_block=1, n_ff=spec.ff, n_head=spec.n_head,
                     n_head_kv=spec.n_head_kv, rms_eps=spec.rms_eps, rope_theta=spec.rope_theta, n_rot=spec.head_dim,
                     n_vocab=n_vocab)
    if "target_layers" not in omit:
        w.add_array("eagle3.target_layers", [int(x) for x in spec.target_layers])
    if "target_hidden_size" not in omit:
        w.add_uint32("eagle3.target_hidden_size", spec.target_hidden_size)
    w.add_bool("eagle3.norm_before_residual", spec.norm_before_residual)
    w.add_file_type(0)
    _finish(w, eagle3_tensors(spec, n_vocab))
    return path


@dataclass
class HybridSpec:
    """A tiny Gated-DeltaNet hybrid: ``qwen35`` (dense) or ``qwen3next`` (MoE FFN).

    Every ``full_attention_interval``-th block is full attention, the others are
    linear attention (llama.cpp: ``(il + 1) % interval != 0`` is recurrent).
    ``n_nextn`` > 0 appends MTP ("nextn") blocks after the trunk, as the real
    Qwen3.5/3.6 GGUFs do (``blk.{n_layer}.nextn.*``, ``<arch>.nextn_predict_layers``).
    """

    arch: str = "qwen35"
    n_embd: int = 64
    n_layer: int = 6
    full_attention_interval: int = 3
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_rot: int = 8  # partial rotary (Qwen3.5: a quarter of head_dim)
    linear_k_heads: int = 2
    linear_v_heads: int = 4
    linear_head_dim: int = 16
    conv_kernel: int = 4
    n_ff: int = 128
    n_nextn: int = 0
    # None: a random eh_proj. A number s: eh_proj = [I | s * random], so the MTP block mostly repeats the
    # trunk's next-token guess from the token embedding (its drafts are often accepted) and reads h a little
    mtp_agree: float | None = None
    n_expert: int = 4  # qwen3next only
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_ctx_train: int = 4096
    seed: int = 0
    noise: float = 0.0
    # the recurrent state must matter: slow decay (exp(-exp(a_log) * softplus(dt)) per token), so that a
    # stale state changes the next tokens (tests catch a wrong rollback by that); weak layers keep the
    # text repetitive enough for n-gram lookup to draft
    layer_scale: float = 0.03
    a_log: float = -3.0  # mean log decay rate of the Gated-DeltaNet heads (lower: longer memory)
    dt_bias: float = -1.0

    def recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0


def _gated_delta_net(rand: _Weights, b: str, spec: HybridSpec) -> dict[str, np.ndarray]:
    """A linear-attention (Gated-DeltaNet) block's mixer: ``qwen35`` splits beta and alpha, ``qwen3next`` joins them."""
    d, s, heads = spec.n_embd, spec.layer_scale, spec.linear_v_heads
    key_dim = spec.linear_head_dim * spec.linear_k_heads
    value_dim = spec.linear_head_dim * heads
    conv_dim = 2 * key_dim + value_dim
    t = {
        b + "attn_qkv.weight": rand((conv_dim, d), s),
        b + "attn_gate.weight": rand((value_dim, d), s),
        b + "ssm_conv1d.weight": rand((conv_dim, spec.conv_kernel), 0.5),
        b + "ssm_dt.bias": rand((heads,), 0.5) + spec.dt_bias,
        b + "ssm_a": -np.exp(rand((heads,), 0.5) + spec.a_log),  # -exp(A_log)
    }
    if spec.arch == "qwen35":
        t[b + "ssm_beta.weight"] = rand((heads, d), s)
        t[b + "ssm_alpha.weight"] = rand((heads, d), s)
    else:
        t[b + "ssm_ba.weight"] = rand((2 * heads, d), s)
    t[b + "ssm_norm.weight"] = _ones(spec.linear_head_dim)
    t[b + "ssm_out.weight"] = rand((d, value_dim), s)
    return t


def write_hybrid(path: str | Path, spec: HybridSpec | None = None, **kw) -> Path:
    """Write a tiny ``qwen35`` / ``qwen3next`` model with random F32 weights (tensors as in ``src/models/<arch>.cpp``)."""
    spec = spec or HybridSpec(**kw)
    a = spec.arch
    if a not in ("qwen35", "qwen3next"):
        raise ValueError(f"tiny hybrids are qwen35 or qwen3next, not {a}")
    path = Path(path)
    w = GGUFWriter(str(path), a)
    w.add_name(f"tiny-{a}-{spec.n_embd}x{spec.n_layer}{f'-mtp{spec.n_nextn}' if spec.n_nextn else ''}-s{spec.seed}")
    n_vocab = copy_tokenizer(w, vocab_path())
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)
    add_decoder_keys(w, n_ctx_train=spec.n_ctx_train, n_embd=spec.n_embd, n_block=spec.n_layer + spec.n_nextn,
                     n_ff=spec.n_ff, n_head=spec.n_head, n_head_kv=spec.n_head_kv, rms_eps=1e-6, head_dim=spec.head_dim,
                     rope_theta=1e7, n_rot=spec.n_rot, n_vocab=n_vocab, n_nextn=spec.n_nextn)
    w.add_file_type(0)
    add_ssm_keys(w, full_attention_interval=spec.full_attention_interval, conv_kernel=spec.conv_kernel,
                 head_dim=spec.linear_head_dim, k_heads=spec.linear_k_heads, v_heads=spec.linear_v_heads)
    if a == "qwen35":  # interleaved M-RoPE; the sections count rotary pairs
        half = spec.n_rot // 2
        w.add_array(f"{a}.rope.dimension_sections", [half - 2 * (half // 3), half // 3, half // 3, 0])
    else:
        add_expert_keys(w, n_expert=spec.n_expert, n_expert_used=spec.n_expert_used, n_ff_exp=spec.n_ff_exp,
                        n_ff_shexp=spec.n_ff)

    rand = _Weights(spec.seed, spec.noise)
    d, s = spec.n_embd, spec.layer_scale
    t = {"token_embd.weight": rand((n_vocab, d), 1.0), "output_norm.weight": _ones(d), "output.weight": rand((n_vocab, d), 0.5)}
    for il in range(spec.n_layer + spec.n_nextn):
        b = f"blk.{il}."
        t[b + "attn_norm.weight"] = _ones(d)
        t[b + "post_attention_norm.weight"] = _ones(d)
        if spec.recurrent(il):
            t.update(_gated_delta_net(rand, b, spec))
        else:  # full attention; the query projection also yields the output gate
            t.update(_attention(rand, b, spec, s, q_mult=2, qk_norm=True))
        if a == "qwen35":
            t.update(_ffn(rand, b, d, spec.n_ff, s))
        else:
            e, fe = spec.n_expert, spec.n_ff_exp
            t[b + "ffn_gate_inp.weight"] = rand((e, d), s)
            t[b + "ffn_gate_exps.weight"] = rand((e, fe, d), s)
            t[b + "ffn_up_exps.weight"] = rand((e, fe, d), s)
            t[b + "ffn_down_exps.weight"] = rand((e, d, fe), s)
            t[b + "ffn_gate_inp_shexp.weight"] = rand((d,), s)
            t.update(_ffn(rand, b, d, spec.n_ff, s, suffix="_shexp"))
        if il >= spec.n_layer:  # MTP block: embedding and hidden state joined by eh_proj
            if spec.mtp_agree is None:
                eh_proj = rand((d, 2 * d), 1.0 / np.sqrt(2 * d))
            else:
                eh_proj = np.concatenate([np.eye(d, dtype=np.float32), rand((d, d), spec.mtp_agree / np.sqrt(d))], axis=1)
            t[b + "nextn.eh_proj.weight"] = eh_proj
            t[b + "nextn.enorm.weight"] = _ones(d)
            t[b + "nextn.hnorm.weight"] = _ones(d)
            t[b + "nextn.shared_head_norm.weight"] = _ones(d)
    _finish(w, t)
    return path
