"""Turning one row of target logits into one token.

The filters run in llama.cpp's order (top-k, top-p, min-p on the untempered
distribution, then temperature). Each sampled position consumes exactly one
uniform draw from the request's generator, so a speculative run that samples
row by row and accepts a draft token only when it equals the target's sample
("sample and match") emits the *same* tokens as plain sampling with the same
seed — the strongest form of "follows the target's distribution exactly".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LocalflashError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise LocalflashError(f"--temp must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise LocalflashError(f"--top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise LocalflashError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise LocalflashError(f"--min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def filtered_distribution(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Candidate token ids and their probabilities after top-k/top-p/min-p and temperature.

    Ids come sorted by descending logit (ties by id), so the result is deterministic.
    """
    n = logits.shape[0]
    if 0 < p.top_k < n:
        ids = np.argpartition(-logits, p.top_k - 1)[: p.top_k]
    else:
        ids = np.arange(n)
    vals = logits[ids].astype(np.float64)
    order = np.lexsort((ids, -vals))
    ids, vals = ids[order], vals[order]
    if p.top_p < 1.0 or p.min_p > 0.0:
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = len(ids)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        ids, vals = ids[: max(keep, 1)], vals[: max(keep, 1)]
    probs = np.exp((vals - vals[0]) / p.temperature)
    return ids, probs / probs.sum()


class Sampler:
    """Samples target rows for one request; greedy when temperature is 0."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        ids, probs = filtered_distribution(logits, self.params)
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(ids[min(i, len(ids) - 1)])
