"""Random anchors and the blocks built on them (the DFlash training recipe).

An anchor is a position ``a`` where both ``a`` and ``a + 1`` are response
tokens (the loss mask). Its block is ``[token[a], MASK × (B-1)]`` at
positions ``a .. a+B-1``; slot ``k`` is labelled with ``token[a + k]``, and
with nothing (``-1``) at slot 0, past the end of the sequence or outside the
response. Anchors are drawn afresh every step (uniformly, without
replacement, sorted): the paper's data augmentation.
"""

from __future__ import annotations

import numpy as np

IGNORE = -1


def valid_anchors(n_tokens: int, n_prompt: int) -> np.ndarray:
    """Positions ``a`` with ``a`` and ``a + 1`` both in the response ``[n_prompt, n_tokens)``."""
    return np.arange(n_prompt, max(n_prompt, n_tokens - 1), dtype=np.int64)


def sample_anchors(rng: np.random.Generator, n_tokens: int, n_prompt: int, n_anchors: int) -> np.ndarray:
    """Up to ``n_anchors`` distinct valid anchors, sorted (all of them when there are fewer)."""
    valid = valid_anchors(n_tokens, n_prompt)
    if len(valid) > n_anchors:
        valid = rng.choice(valid, size=n_anchors, replace=False)
    return np.sort(valid)


def build_blocks(tokens: np.ndarray, n_prompt: int, anchors: np.ndarray, block_size: int, mask_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Block inputs ``[N, B]`` and labels ``[N, B]`` (``IGNORE`` where there is nothing to predict)."""
    n = len(tokens)
    offs = np.arange(block_size)
    blocks = np.full((len(anchors), block_size), mask_id, dtype=np.int64)
    blocks[:, 0] = tokens[anchors]
    pos = anchors[:, None] + offs[None, :]
    inside = (pos < n) & (pos >= n_prompt) & (offs[None, :] > 0)
    labels = np.where(inside, tokens[np.minimum(pos, n - 1)], IGNORE)
    return blocks, labels.astype(np.int64)
