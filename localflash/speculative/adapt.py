"""Choosing the draft length each cycle from measured costs and acceptance.

Expected tokens committed by a cycle that drafts k tokens:
    E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j
where a_j is the (recent) rate at which position j is accepted given that
position j-1 was. Its cost is verify(k+1) + draft(k), both measured on this
machine as the run goes. The policy picks the k in 0..max that maximises
E(k)/cost(k); k = 0 is plain decoding, chosen when drafting does not pay.
Timings are noisy (a shared machine, a cost measured once), so the cost of
k+1 is never taken below that of k, and drafting must promise at least
MARGIN more tokens per second than plain decoding before it is chosen:
a marginal "win" of the model is a loss as often as not.
While drafting is off it still probes now and then, so it can turn back on;
each probe that does not turn it back on doubles the wait for the next one
(PROBE_EVERY .. PROBE_MAX cycles), and probes are spaced so they cost at most
PROBE_SHARE of the time spent off (:func:`probe_floor`: a CPU where a probe's
draft and rows cost a few plain steps waits hundreds of steps, a GPU where they
are nearly free only the doubling waits), so a drafter that never pays costs little.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

import numpy as np

PRIOR_HITS, PRIOR_TRIES = 1.0, 2.0  # optimistic 0.5 until the run says otherwise
DECAY = 0.98  # weight of history per observation: adapts to phase changes (thinking vs answer)
MARGIN = 0.05  # drafting must promise this much more throughput than plain decoding
PROBE_EVERY = 16  # first probe after this many cycles off
PROBE_MAX = 256  # the wait doubles after each probe that does not pay, up to this
PROBE_SHARE = 0.01  # probes may cost this share of the plain steps' time while drafting is off
PROBE_FLOOR_MAX = 4 * PROBE_MAX  # ... but a probe comes at least this often (acceptance can change with the text)
PROBE_DRAFT = 2  # a probe's draft length


def probe_floor(plain: float | None, probe: float | None, draft: float | None, measured: float | None = None) -> float:
    """Plain steps to wait at least before a probe so probes cost at most PROBE_SHARE of the time off:
    a probe's extra over a plain step (``probe`` - ``plain``: its verify's extra rows, plus its ``draft``;
    or what the last probe was ``measured`` to cost over a plain step, if more: a draft model that catches
    up on the tokens it missed pays for them in the probe), / PROBE_SHARE. Where drafts and rows are nearly
    free (a GPU) this is below the doubling waits."""
    if not plain or probe is None:
        return 0.0
    extra = max(max(probe - plain, 0.0) + (draft or 0.0), measured or 0.0)
    return min(PROBE_FLOOR_MAX, extra / (PROBE_SHARE * plain))


@dataclass
class CostTable:
    """EMA of seconds per call, by size; unmeasured sizes are interpolated."""

    ema: dict[int, float] = field(default_factory=dict)
    alpha: float = 0.2
    sizes: list[int] = field(default_factory=list)  # the measured sizes, ascending (kept by add)

    def add(self, size: int, seconds: float) -> None:
        ema = self.ema
        if size in ema:
            old = ema[size]
            ema[size] = old + self.alpha * (seconds - old)
        else:
            insort(self.sizes, size)
            ema[size] = seconds

    def __call__(self, size: int) -> float | None:
        if size in self.ema:
            return self.ema[size]
        if not self.ema:
            return None
        if len(self.sizes) != len(self.ema):  # ema filled directly (tests, copies): re-sort once
            self.sizes = sorted(self.ema)
        i = bisect_left(self.sizes, size)  # sizes[i - 1] < size < sizes[i]
        if 0 < i < len(self.sizes):
            lo, hi = self.sizes[i - 1], self.sizes[i]
            f = (size - lo) / (hi - lo)
            return self.ema[lo] + f * (self.ema[hi] - self.ema[lo])
        # outside the measured range: scale the nearest by size (pessimistic for verify)
        if i:
            near = self.sizes[-1]
            return self.ema[near] * max(size, 1) / max(near, 1)
        return self.ema[self.sizes[0]]

    def many(self, sizes) -> np.ndarray | None:
        """``self(size)`` for every size of ``sizes`` (ints), the same values, as array operations (a tree's sizes
        1..n: no Python call a size); None where nothing is measured."""
        if not self.ema:
            return None
        if len(self.sizes) != len(self.ema):
            self.sizes = sorted(self.ema)
        xs = np.array(self.sizes, np.float64)
        ys = np.array([self.ema[x] for x in self.sizes], np.float64)
        s = np.asarray(sizes, np.float64)
        m = len(xs)
        i = np.searchsorted(xs, s)  # bisect_left
        lo, hi = np.maximum(i - 1, 0), np.minimum(i, m - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = ys[lo] + (s - xs[lo]) / (xs[hi] - xs[lo]) * (ys[hi] - ys[lo])
        out = np.where(i == 0, ys[0], np.where(i == m, ys[-1] * np.maximum(s, 1) / max(xs[-1], 1), inner))
        return np.where(xs[hi] == s, ys[hi], out)  # a measured size: its own value


class DraftPolicy:
    """Fixed (``adaptive=False``) or cost-model draft length in ``0..max_draft``."""

    def __init__(self, max_draft: int, adaptive: bool = True, draft_cost_grows: bool = True):
        self.max_draft = max_draft
        self.adaptive = adaptive
        self.draft_cost_grows = draft_cost_grows
        self.verify = CostTable()
        self.draft = CostTable()
        self.hits = [0.0] * max_draft
        self.tries = [0.0] * max_draft
        self.cycles_off = 0
        self.probe_wait = PROBE_EVERY
        self.probing = False  # the last choice was a probe, not the model's pick
        self.probe_extra: float | None = None  # seconds the last probe cycle took over a plain step
        self.last_choice = max_draft

    def accept_rate(self, j: int) -> float:
        return (self.hits[j] + PRIOR_HITS) / (self.tries[j] + PRIOR_TRIES)

    def seed(self, position_acceptance, weight: float = 4.0) -> None:
        """Start from measured acceptance per draft position (a bench verdict), worth ``weight`` tries each."""
        for j, rate in enumerate(list(position_acceptance)[: self.max_draft]):
            self.hits[j] = float(rate) * weight
            self.tries[j] = weight

    def expected_tokens(self, k: int) -> float:
        e, run = 1.0, 1.0
        for j in range(k):
            run *= self.accept_rate(j)
            e += run
        return e

    def cost(self, k: int) -> float | None:
        v = self.verify(k + 1)
        if v is None:
            return None
        if k == 0:
            return v
        d = self.draft(k if self.draft_cost_grows else 1)
        return v + (d or 0.0)

    def choose(self, limit: int) -> int:
        """Draft length for the next cycle, at most ``limit`` (context or token budget)."""
        top = self.max_draft if self.max_draft < limit else limit
        if top <= 0 or not self.adaptive:
            top = top if top > 0 else 0
            self.last_choice = top
            return top
        best, best_score, expected, run, floor = 0, -1.0, 1.0, 1.0, 0.0
        for k in range(top + 1):
            if k:
                run *= self.accept_rate(k - 1)
                expected += run
            c = self.cost(k)
            if c is None or c <= 0:
                self.last_choice = top  # not measured yet: try the full length once
                return top
            floor = c = max(c, floor)  # a longer draft never costs less
            score = expected / c
            if k == 0:
                best_score = score * (1.0 + MARGIN)
            elif score > best_score:  # ties go to the shorter draft
                best, best_score = k, score
        if best == 0:
            if self.probing:  # the probe did not turn drafting back on: wait longer next time
                self.probe_wait = min(PROBE_MAX, 2 * self.probe_wait)
            self.probing = False
            self.cycles_off += 1
            if self.cycles_off >= self.probe_wait and self.cycles_off >= self.probe_floor(min(PROBE_DRAFT, top)):
                self.cycles_off = 0
                self.probing = True
                best = min(PROBE_DRAFT, top)
        else:
            self.cycles_off = 0
            self.probe_wait = PROBE_EVERY
            self.probing = False
        self.last_choice = best
        return best

    def probe_floor(self, k: int) -> float:
        """Plain steps to wait at least before a probe of ``k`` drafts (:func:`probe_floor`)."""
        return probe_floor(self.verify(1), self.verify(k + 1), self.draft(k if self.draft_cost_grows else 1), self.probe_extra)

    def off_reason(self) -> str | None:
        """Why the cost model keeps drafting off, in words and measured numbers; None while drafting pays."""
        plain = self.cost(0)
        if not (self.adaptive and self.max_draft) or not plain:
            return None
        costs = [plain]
        for k in range(1, self.max_draft + 1):
            costs.append(max(self.cost(k) or 0.0, costs[-1]))  # as choose(): a longer draft never costs less
        k = max(range(1, self.max_draft + 1), key=lambda k: self.expected_tokens(k) / costs[k])
        gain = self.expected_tokens(k) / (costs[k] / plain)
        if gain > 1.0 + MARGIN:
            return None
        verify = min(max(self.verify(k + 1) or plain, plain), costs[k]) / plain  # never below one token (as choose())
        draft = costs[k] / plain - verify
        text = (f"drafting off: here a {k}-token draft costs {draft:.1f}× one target token and its {k + 1}-token verify "
                f"{verify:.1f}×, for {self.expected_tokens(k):.2f} tokens a pass ({gain:.2f}× plain)")
        if verify + draft >= 2:
            return text + "; drafting pays where both are nearly free next to one token, as on a GPU"
        return text + "; the drafter's tokens are not accepted often enough here"

    def record(self, n_drafted: int, n_accepted: int, t_verify: float, t_draft: float) -> None:
        if self.probing and n_drafted:
            self.probe_extra = t_draft + max(t_verify - (self.verify(1) or 0.0), 0.0)
        self.verify.add(n_drafted + 1, t_verify)
        if n_drafted:
            self.draft.add(n_drafted if self.draft_cost_grows else 1, t_draft)
        for j in range(n_accepted + 1 if n_accepted < n_drafted else n_drafted):
            self.tries[j] = self.tries[j] * DECAY + 1.0
            self.hits[j] = self.hits[j] * DECAY + (1.0 if j < n_accepted else 0.0)
