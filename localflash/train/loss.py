"""Position-weighted cross-entropy: ``w_k = exp(-(k - 1) / γ)`` for block slot ``k >= 1``.

Early slots matter most (a draft is accepted only up to its first miss), so
they weigh more; slot 0 (the anchor, already known) weighs nothing. The loss
is ``Σ w_k m_k CE_k / Σ w_k m_k`` over all blocks, ``m_k`` masking slots
without a label. γ = 7 for B = 16, 5 for B = 10, 4 for B = 8 in the paper.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from localflash.train.anchors import IGNORE


def default_gamma(block_size: int) -> float:
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size * 7.0 / 16.0))


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """``[B]``: 0 for the anchor slot, ``exp(-(k-1)/γ)`` for slot ``k``."""
    w = [0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)]
    return torch.tensor(w, dtype=torch.float32)


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Loss over the draft slots ``1..K`` of each block.

    ``logits`` ``[..., K, V]``, ``labels`` ``[..., K]`` (``IGNORE`` = no label),
    ``weights`` ``[K]`` (``position_weights(B, γ)[1:]``). Returns the loss and
    detached statistics: per-slot accuracy and the τ a greedy verifier would
    get on these blocks (1 + the run of correct slots, bonus token included).
    """
    v = logits.shape[-1]
    has = labels != IGNORE
    ce = F.cross_entropy(logits.reshape(-1, v).float(), labels.clamp_min(0).reshape(-1), reduction="none").view(labels.shape)
    w = weights.to(ce.device) * has
    loss = (ce * w).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & has
        dims = tuple(range(hit.dim() - 1))
        slot_acc = hit.sum(dim=dims).float() / has.sum(dim=dims).clamp_min(1).float()
        # a block counts where its first slot has a label; its run stops at the first miss or missing label
        run = torch.cumprod(hit.long(), dim=-1).sum(-1)
        counted = has[..., 0]
        tau = 1.0 + (run[counted].float().mean().item() if counted.any() else 0.0)
    return loss, {"slot_acc": slot_acc.cpu(), "tau": tau, "n_labels": int(has.sum())}
