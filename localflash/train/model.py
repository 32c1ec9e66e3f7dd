"""The DFlash drafter in PyTorch: the z-lab architecture, computing what llama.cpp computes.

- Fusion: ``h = hidden_norm(fc(concat of the tapped target layers))`` for every
  committed (context) position.
- Every layer is a Qwen3 decoder layer (pre-norm, q/k RMSNorm per head
  before RoPE, GQA, SwiGLU) whose attention sees two kinds of keys/values:
  the context's, computed from ``h`` alone with the layer's own ``k_proj``,
  ``k_norm`` and ``v_proj`` (KV injection; cached at inference), and the
  block's own. Queries come from the block only.
- RoPE: NeoX layout (rotate halves) over the whole head, the drafter's own
  theta; absolute positions (context ``0..S-1``, block ``anchor..anchor+B-1``).
- Masks: block queries see context positions ``< anchor`` (the anchor's own
  features do not exist yet at inference). Inside the block a layer is
  bidirectional unless it is causal; a sliding layer also drops keys with
  ``q_pos - k_pos >= window``. Which layers are causal: ``spec.causal`` when
  set (llama.cpp's single ``attention.causal`` flag), else the HF/z-lab
  default, sliding layers causal and full layers not. ``llama_semantics=True``
  reproduces llama.cpp, which has no per-layer causality: without the flag
  every layer is bidirectional in the block.
- The embedding and LM head are the target's, frozen (buffers, not
  parameters). A reduced-vocabulary drafter has its own frozen head: the
  target's rows for the ``d2t`` tokens.

Parameter names follow the HF checkpoint (``layers.0.self_attn.q_proj.weight``)
so a state dict converts to GGUF with :mod:`localflash.formats.dflash_hf`'s name map.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from localflash.formats.dflash_gguf import DFlashSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of NeoX RoPE for ``positions`` (any shape): ``[..., head_dim]``."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    ang = positions.to(torch.float64)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x``: ``[..., T, H, D]``; ``cos``/``sin``: ``[..., T, D]`` (broadcast over heads), in ``x``'s dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos[..., None, :].to(x.dtype) + rot * sin[..., None, :].to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, spec: DFlashSpec, index: int, causal: bool, sliding: bool):
        super().__init__()
        d, hd = spec.n_embd, spec.head_dim
        self.n_head, self.n_kv, self.hd = spec.n_head, spec.n_head_kv, hd
        self.causal, self.sliding, self.window = causal, sliding, spec.swa_window
        self.input_layernorm = RMSNorm(d, spec.rms_eps)
        self.post_attention_layernorm = RMSNorm(d, spec.rms_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, spec.n_head * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(d, spec.n_head_kv * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(d, spec.n_head_kv * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(spec.n_head * hd, d, bias=False)
        self.self_attn.q_norm = RMSNorm(hd, spec.rms_eps)
        self.self_attn.k_norm = RMSNorm(hd, spec.rms_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, spec.ff, bias=False)
        self.mlp.up_proj = nn.Linear(d, spec.ff, bias=False)
        self.mlp.down_proj = nn.Linear(spec.ff, d, bias=False)

    def context_kv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Injected K/V of the fused context ``h`` ``[Bt, S, D]``: ``[Bt, S, Hkv, hd]`` each."""
        a = self.self_attn
        bt, s, _ = h.shape
        k = a.k_norm(a.k_proj(h).view(bt, s, self.n_kv, self.hd))
        v = a.v_proj(h).view(bt, s, self.n_kv, self.hd)
        return apply_rope(k, cos, sin), v

    def forward(self, x, kc, vc, cos, sin, ctx_mask, blk_mask):
        """``x``: block states ``[Bt, N, B, D]``; ``kc``/``vc``: the context, ``[Bt, S, Hkv, hd]``
        (shared by all blocks) or ``[Bt, N, W, Hkv, hd]`` (each block's own window);
        ``ctx_mask``: ``[Bt, N, B, S or W]`` bool (True = visible); ``blk_mask``: ``[B, B]``."""
        a = self.self_attn
        bt, n, b, _ = x.shape
        y = self.input_layernorm(x)
        q = a.q_norm(a.q_proj(y).view(bt, n, b, self.n_head, self.hd))
        k = a.k_norm(a.k_proj(y).view(bt, n, b, self.n_kv, self.hd))
        v = a.v_proj(y).view(bt, n, b, self.n_kv, self.hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.n_head // self.n_kv
        qg = q.view(bt, n, b, self.n_kv, rep, self.hd)
        scale = 1.0 / math.sqrt(self.hd)
        per_block = kc.dim() == 5
        ctx_eq = ("bnqhrd,bnshd->bnhrqs", "bnhrqs,bnshd->bnqhrd") if per_block else ("bnqhrd,bshd->bnhrqs", "bnhrqs,bshd->bnqhrd")
        # scores against the context and against the own block, in float32
        sc = torch.einsum(ctx_eq[0], qg, kc).float() * scale
        sb = torch.einsum("bnqhrd,bnkhd->bnhrqk", qg, k).float() * scale
        sc = sc.masked_fill(~ctx_mask[:, :, None, None], float("-inf"))
        sb = sb.masked_fill(~blk_mask, float("-inf"))
        p = torch.softmax(torch.cat([sc, sb], dim=-1), dim=-1)
        s = kc.shape[-3]
        pc, pb = p[..., :s].to(vc.dtype), p[..., s:].to(v.dtype)
        o = torch.einsum(ctx_eq[1], pc, vc) + torch.einsum("bnhrqk,bnkhd->bnqhrd", pb, v)
        x = x + a.o_proj(o.reshape(bt, n, b, self.n_head * self.hd))
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class DFlashDraft(nn.Module):
    """A DFlash drafter; ``embed``/``head`` are the target's (frozen), ``d2t`` maps a reduced head."""

    def __init__(
        self,
        spec: DFlashSpec,
        embed: torch.Tensor,
        head: torch.Tensor,
        d2t: torch.Tensor | None = None,
        llama_semantics: bool = False,
        train_head: bool = False,
    ):
        super().__init__()
        if spec.rope_scaling:
            raise ValueError("rope scaling is not implemented in the PyTorch drafter")
        self.spec = spec
        d = spec.n_embd
        self.fc = nn.Linear(len(spec.target_layers) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, spec.rms_eps)
        self.norm = RMSNorm(d, spec.rms_eps)
        sliding = [bool(spec.swa_window) and bool((spec.swa_layers or [True] * spec.n_layer)[i]) for i in range(spec.n_layer)]
        if spec.causal is not None:
            causal = [bool(spec.causal)] * spec.n_layer
        elif llama_semantics:
            causal = [False] * spec.n_layer
        else:
            causal = sliding
        self.layers = nn.ModuleList(DecoderLayer(spec, i, causal[i], sliding[i]) for i in range(spec.n_layer))
        # per-channel scale of the target features, folded into fc on export: target hidden states
        # carry a few channels hundreds of times larger than the rest, which a random fc cannot see past
        self.register_buffer("feat_scale", torch.ones(len(spec.target_layers) * d), persistent=False)
        self.register_buffer("embed", embed.float(), persistent=False)
        if train_head:  # only for a reduced vocabulary: the head is then the drafter's own tensor
            if d2t is None:
                raise ValueError("a trainable head needs a reduced draft vocabulary (d2t); the full one is the target's")
            self.head = nn.Parameter(head.float().clone())
        else:
            self.register_buffer("head", head.float(), persistent=False)
        self.register_buffer("d2t", d2t.long() if d2t is not None else None, persistent=False)
        self.n_vocab = embed.shape[0]
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name == "head":
                continue
            with torch.no_grad():
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    # -- pieces --------------------------------------------------------------------------
    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """``[Bt, S, K*D]`` target features -> fused context ``[Bt, S, D]``."""
        return self.hidden_norm(self.fc(feats * self.feat_scale.to(feats.dtype)))

    def window_index(self, anchors: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For sliding layers: the ``W-1`` context positions any query of a block can see
        (``[Bt, N, W-1]``, clamped at 0), and the ``[Bt, N, B, W-1]`` visibility mask."""
        w = self.spec.swa_window
        dev = anchors.device
        idx = anchors[..., None] - (w - 1) + torch.arange(w - 1, device=dev)  # [Bt, N, W-1]
        qpos = anchors[..., None] + torch.arange(b, device=dev)  # [Bt, N, B]
        visible = (idx[..., None, :] >= 0) & ((qpos[..., None] - idx[..., None, :]) < w)
        blk = torch.ones(b, b, dtype=torch.bool, device=dev)
        return idx.clamp_min(0), visible, blk

    def masks(self, layer: DecoderLayer, anchors: torch.Tensor, s: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        dev = anchors.device
        kpos = torch.arange(s, device=dev)
        qpos = anchors[..., None] + torch.arange(b, device=dev)  # [Bt, N, B]
        ctx = kpos < anchors[..., None, None]  # [Bt, N, 1, S]
        ctx = ctx.expand(*anchors.shape, b, s)
        off = torch.arange(b, device=dev)
        diff = off[:, None] - off[None, :]  # q - k inside the block
        blk = torch.ones(b, b, dtype=torch.bool, device=dev)
        if layer.causal:
            blk = blk & (diff >= 0)
        if layer.sliding:
            ctx = ctx & ((qpos[..., None] - kpos) < layer.window)
            blk = blk & (diff < layer.window)
        return ctx, blk

    def forward(self, feats: torch.Tensor, block_tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[Bt, N, B, D]`` of blocks ``block_tokens`` ``[Bt, N, B]``
        at ``anchors`` ``[Bt, N]``, given context features ``feats`` ``[Bt, S, K*D]``."""
        bt, s, _ = feats.shape
        b = block_tokens.shape[-1]
        hd = self.spec.head_dim
        h = self.fuse(feats)
        cos_c, sin_c = rope_tables(torch.arange(s, device=feats.device).expand(bt, s), hd, self.spec.rope_theta)
        pos = anchors[..., None] + torch.arange(b, device=feats.device)
        cos_b, sin_b = rope_tables(pos, hd, self.spec.rope_theta)
        x = F.embedding(block_tokens, self.embed).to(h.dtype)
        if self.spec.embedding_scale:
            x = x * self.spec.embedding_scale
        cache: dict[tuple[bool, bool], tuple[torch.Tensor, ...]] = {}
        # a sliding layer whose window is shorter than the context gathers each block's window
        # (cost ~ W instead of S); otherwise every block attends the shared context under a mask
        windowed = bool(self.spec.swa_window) and self.spec.swa_window - 1 < s
        rows = torch.arange(bt, device=feats.device)[:, None, None]
        for layer in self.layers:
            kc, vc = layer.context_kv(h, cos_c, sin_c)
            key = (layer.causal, layer.sliding)
            if layer.sliding and windowed:
                if key not in cache:
                    idx, visible, blk = self.window_index(anchors, b)
                    if layer.causal:
                        blk = torch.tril(blk)
                    if layer.window < b:
                        off = torch.arange(b, device=feats.device)
                        blk = blk & ((off[:, None] - off[None, :]) < layer.window)
                    cache[key] = (idx, visible, blk)
                idx, visible, blk = cache[key]
                x = layer(x, kc[rows, idx], vc[rows, idx], cos_b, sin_b, visible, blk)
            else:
                if key not in cache:
                    cache[key] = self.masks(layer, anchors, s, b)
                x = layer(x, kc, vc, cos_b, sin_b, *cache[key])
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (``[.., Vd]``; the full vocabulary when there is no ``d2t``)."""
        flat = hidden.reshape(-1, hidden.shape[-1])  # one matmul, never a broadcast copy of the head
        return (flat @ self.head.to(hidden.dtype).T).view(*hidden.shape[:-1], -1)

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary (``-inf`` outside the draft vocabulary), as llama.cpp returns them."""
        lg = self.logits(hidden).float()
        if self.d2t is None:
            return lg
        out = torch.full((*lg.shape[:-1], self.n_vocab), float("-inf"), dtype=lg.dtype, device=lg.device)
        out[..., self.d2t] = lg
        return out

    @torch.no_grad()
    def draft_logits(self, feats: np.ndarray, block: list[int], start: int) -> np.ndarray:
        """One inference block: context rows ``feats`` at ``0..start-1``, ``block`` at ``start..``."""
        f = torch.as_tensor(np.asarray(feats[:start], np.float32))[None]
        toks = torch.as_tensor(block, dtype=torch.long)[None, None]
        anchors = torch.tensor([[start]])
        return self.full_logits(self.forward(f, toks, anchors))[0, 0].numpy()

    # -- weights ---------------------------------------------------------------------------
    def hf_state(self) -> dict[str, np.ndarray]:
        """Trainable weights under HF checkpoint names, as float32 NumPy arrays (``feat_scale`` folded into fc)."""
        out = {k: v.detach().float().cpu().numpy() for k, v in self.state_dict().items() if k != "head"}
        out["fc.weight"] = out["fc.weight"] * self.feat_scale.detach().float().cpu().numpy()[None, :]
        return out

    def set_feature_scale(self, feats: np.ndarray) -> None:
        """Scale each feature channel to unit RMS over ``feats`` ``[n, K*D]`` (rows of many positions)."""
        rms = np.sqrt(np.mean(np.square(feats.astype(np.float64)), axis=0))
        with torch.no_grad():
            self.feat_scale.copy_(torch.from_numpy(1.0 / np.maximum(rms, 1e-3)).float())


def target_matrices(target_path) -> tuple[np.ndarray, np.ndarray]:
    """The target's token embedding and output head as float32 ``[n_vocab, n_embd]`` arrays."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(target_path))
    by = {t.name: t for t in r.tensors}

    def load(t) -> np.ndarray:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return np.array(t.data, dtype=np.float32).reshape(shape)
        return dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)

    embed = load(by["token_embd.weight"])
    head = load(by["output.weight"]) if "output.weight" in by else embed
    return embed, head


def from_gguf(drafter_path, target_path, llama_semantics: bool = True) -> DFlashDraft:
    """A PyTorch drafter with the weights of a ``dflash`` GGUF and its target's embedding/head."""
    from localflash.formats.dflash_gguf import read_dflash_gguf
    from localflash.formats.dflash_hf import gguf_to_hf_name

    info, tensors = read_dflash_gguf(drafter_path)
    embed, head = target_matrices(target_path)
    d2t = tensors.pop("d2t", None)
    own_head = tensors.pop("output.weight", None)
    if d2t is not None:
        head = own_head
    elif own_head is not None:
        head = own_head
    model = DFlashDraft(
        info.spec, torch.from_numpy(embed), torch.from_numpy(np.ascontiguousarray(head)),
        torch.from_numpy(d2t) if d2t is not None else None, llama_semantics=llama_semantics,
    )
    state = {gguf_to_hf_name(k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items() if k != "token_embd.weight"}
    model.load_state_dict(state, strict=True)
    return model
