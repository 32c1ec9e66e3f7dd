"""The book's token on a flat row (top-k off; top-p and/or min-p keep much of the vocabulary), without a sort.

On a flat row (an unsure model, a high temperature) top-p 0.95 keeps most of the
vocabulary, so the window of :func:`~localflash.speculative.sampling.kept_set` cannot
hold the kept set and the book sorts everything. Both of the book's decisions are
weighted selections, made here in a few O(V) NumPy passes:

- the top-p cut: the first rank (descending logit, ties by id) whose cumulative weight
  ``exp(x - top)`` reaches ``top_p * Z``; min-p on top is a count (``w >= min_p``);
- the draw: the first kept rank whose cumulative tempered weight ``exp((x - top) / T)``
  exceeds ``u * Z2`` (``Z2``: the kept set's tempered total).

Every token goes to one of ``BINS`` equal-width logit bins (bin 0 holds the top; a bin
is a range of logits, so the bins are in the book's order), and one scatter
(``np.add.at``) of both weights at once, as the real and imaginary parts of one complex
number per token, gives each bin's exact mass of each. The bin where a cumulative mass
crosses its target is the only part that needs ordering: its tokens' logits are sorted
(a few hundred on a flat row) and ties go by id among the tokens of the drawn logit.

What a row costs is the sweep: per token, the book's two float64 terms (an ``exp`` each),
the bin and the scatter. The terms cannot be cheaper: both decisions compare running sums
with a fraction of a total (``Z``, ``Z2``) over most of the vocabulary, and a flat row's
deciding token weighs 1e-6 to 3e-6 of that total (normal logits at 151,936 and 248,320
tokens, top-p 0.95 keeping 56-85%), so a total known only to a float32 ``exp``'s accuracy
(half a float32 step, 6e-8, per term at best, before the argument's own rounding) would
leave a large share of decisions open; bounds from the bins' edges are looser still (a bin
is ``range / 2046`` of a logit wide).

Exactness. The book compares sequential float64 cumulative sums; these are other sums of
the same float64 terms (the same ``exp`` of the same differences). Any sum of at most ``n``
non-negative terms, in any order, lies within ``1 +- g`` of the exact sum,
``g = (n + 2) u / (1 - (n + 2) u)``, ``u = 2**-53`` (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., eq. 4.4 for non-negative terms; two more roundings cover
the offset added to a bin's running sum). So the book's cumulative weight and ours at the
same rank differ by at most a factor ``1 +- (2g + 3g^2)``, and its target (``top_p`` or
``u`` times its total, rounded once) and ours by at most ``1 +- (2g + 2u + ...)``. A decision
is taken only where no cumulative weight lies within ``target * (1 +- slack(n))``,
``slack(n) = 4g + 8u``; then it is the book's. Otherwise :func:`sample_flat` returns None
and the caller takes the book's way (rare: the open interval is about ``4 slack(n) Z / w``
of a token wide, ``w`` the weight of the token at the boundary).
"""

from __future__ import annotations

import math
import threading

import numpy as np

U = 2.0**-53
BINS = 2048  # equal-width logit bins from the top logit down to the lowest (int16 bin numbers)
CHUNK = 32768  # tokens per pass of the sweep: its float64 scratch stays in a core's L2 cache


def slack(n: int) -> float:
    """Relative margin within which the sums here and the book's may order a cumulative weight and a target differently."""
    g = (n + 2) * U / (1 - (n + 2) * U)
    return 4 * g + 8 * U


class _Buffers(threading.local):
    """Per-thread scratch reused across calls (fresh 1-2 MB arrays cost page faults)."""

    def __init__(self):
        # differences, both weights of a token as one complex number (real: exp(d), imaginary: exp(d / T)), bins
        self.chunk = (np.empty(CHUNK), np.empty(CHUNK, np.complex128), np.empty(CHUNK, np.intp))
        self.bins: dict[int, np.ndarray] = {}

    def bins_for(self, n: int) -> np.ndarray:
        got = self.bins.get(n)
        if got is None:
            got = self.bins[n] = np.empty(n, np.int16)
        return got


_buffers = _Buffers()


def sample_flat(logits: np.ndarray, top_p: float, min_p: float, temperature: float, u: float) -> tuple[int | None, bool]:
    """The token :func:`~localflash.speculative.sampling.reference_sample` gives at ``u`` with top-k off (None
    when a decision falls within :func:`slack` of a boundary or the row is not finite: take the book's way
    then), and whether the row is flat (its top bin holds under half the mass: the next row may skip the window)."""
    top, low = float(logits.max()), float(logits.min())
    if not (math.isfinite(top) and math.isfinite(low)):
        return None, False
    row = _Row(logits, top, low, temperature, min_p)
    flat = bool(row.cum_w[0] < 0.5 * row.cum_w[-1])
    kept = row.top_p_cut(top_p) if top_p < 1.0 else _Kept(BINS, np.empty(0, np.intp), np.empty(0, logits.dtype), 0)
    if kept is not None and min_p > 0.0 and row.min_p_count < kept.size(row):
        kept = row.min_p_set(min_p)
    return (None if kept is None else row.draw(kept, temperature, u)), flat


class _Kept:
    """A kept set as the book's sorted prefix: every token in bins below ``k`` (all of them), then the first
    ``j`` of the band (``ids`` and logits ``vals`` in the book's order: every token of the bins from ``k`` on
    that the band covers)."""

    def __init__(self, k: int, ids: np.ndarray, vals: np.ndarray, j: int):
        self.k, self.ids, self.vals, self.j = k, ids, vals, j

    def size(self, row: _Row) -> int:
        return int(np.count_nonzero(row.bins < self.k)) + self.j


class _Row:
    """One row's logit bins and the running mass of each weight through them, from one sweep over the row."""

    def __init__(self, logits: np.ndarray, top: float, low: float, temperature: float, min_p: float):
        self.x = x = logits
        n = x.shape[0]
        self.top, self.slack = top, slack(n)
        # bin = trunc((x - top) * -scale) in float64: monotone in x, so each bin is a range of logits, bin 0 the
        # top's; with BINS - 2 over the range, rounding (2u relative) keeps every bin below BINS - 1
        self.scale = scale = 0.0 if top == low else (BINS - 2) / (top - low)
        self.bins = _buffers.bins_for(n)
        d_buf, c_buf, b_buf = _buffers.chunk
        tempered = temperature != 1.0
        # one scatter adds both weights: a complex add is the two float64 adds, so each part's bin sums are the
        # same float64 sums a real scatter of that weight makes (one pass over the indices instead of two)
        mass = np.zeros(BINS, np.complex128 if tempered else np.float64)
        self.min_p_count = 0  # the book's min-p count: tokens with w >= min_p
        for at in range(0, n, CHUNK):
            xc = x[at : at + CHUNK]
            m = len(xc)
            d, c, b = d_buf[:m], c_buf[:m], b_buf[:m]
            d[:] = xc  # exact (a float32 is a float64)
            np.subtract(d, top, out=d)  # the book's differences, rounded as its float64 subtraction rounds them
            # the cast truncates: floor, as the product is >= 0 (to int16 first: a cheaper conversion than to intp)
            np.multiply(d, -scale, out=self.bins[at : at + m], casting="unsafe")
            b[:] = self.bins[at : at + m]  # the scatter's indices (its fast path takes intp)
            w = c.real if tempered else c_buf.view(np.float64)[:m]  # untempered: one weight, contiguous
            np.exp(d, out=w)  # the book's weights
            if min_p > 0.0:
                self.min_p_count += int(np.count_nonzero(w >= min_p))
            if tempered:
                np.divide(d, temperature, out=d)  # the book's tempered differences
                np.exp(d, out=c.imag)  # and weights
                np.add.at(mass, b, c)
            else:
                np.add.at(mass, b, w)
        self.cum_w = np.cumsum(mass.real if tempered else mass)
        self.cum_v = np.cumsum(mass.imag) if tempered else self.cum_w

    def bin_of(self, value: float) -> int:
        """The bin of a logit (the row's float64 steps; clipped to the bins)."""
        return int(min(max((value - self.top) * -self.scale, 0.0), BINS - 1))

    def band(self, k1: int, k2: int) -> tuple[np.ndarray, np.ndarray]:
        """Every token in bins ``k1..k2`` in the book's order (descending logit, ties by id), and its logit."""
        b = self.bins
        ids = np.flatnonzero(b == k1) if k1 == k2 else np.flatnonzero((b >= k1) & (b <= k2))
        vals = self.x[ids]
        order = np.argsort(-vals, kind="stable")  # ids ascending: ties stay by id
        return ids[order], vals[order]

    def cumulative(self, offset: float, band: np.ndarray, temperature: float) -> np.ndarray:
        """``offset``, then ``offset`` plus the running (tempered) weight of ``band``."""
        d = band.astype(np.float64) - self.top
        out = np.empty(len(band) + 1)
        out[0] = offset
        np.cumsum(np.exp(d if temperature == 1.0 else d / temperature), out=out[1:])
        out[1:] += offset
        return out

    def top_p_cut(self, top_p: float) -> _Kept | None:
        """The bin(s) where the running weight reaches ``top_p * Z``; inside them, the book's cut."""
        cum = self.cum_w
        target = top_p * float(cum[-1])
        lo, hi = target * (1 - self.slack), target * (1 + self.slack)
        k1, k2 = int(np.searchsorted(cum, lo)), min(int(np.searchsorted(cum, hi)), BINS - 1)
        offset = float(cum[k1 - 1]) if k1 else 0.0
        ids, vals = self.band(k1, k2)
        run = self.cumulative(offset, vals, 1.0)
        j_lo, j_hi = int(np.searchsorted(run, lo)), int(np.searchsorted(run, hi))
        if j_lo != j_hi or not 0 < j_lo < len(run):
            return None
        return _Kept(k1, ids, vals, j_lo)  # the first j_lo of the band reach the target

    def min_p_set(self, min_p: float) -> _Kept | None:
        """Min-p binds: the book keeps its first ``min_p_count`` tokens (``w >= min_p``). Tokens in bins well above
        ``top + log(min_p)`` pass, well below fail; the bins around it are sorted and checked."""
        k = self.bin_of(self.top + math.log(min_p))
        k1, k2 = max(k - 1, 0), min(k + 1, BINS - 1)
        ids, vals = self.band(k1, k2)
        passing = np.exp(vals.astype(np.float64) - self.top) >= min_p
        j = int(np.count_nonzero(passing))
        if not passing[:j].all() or int(np.count_nonzero(self.bins < k1)) + j != self.min_p_count:
            return None
        return _Kept(k1, ids, vals, j)

    def draw(self, kept: _Kept, temperature: float, u: float) -> int | None:
        """The book's inverse-CDF draw over the kept set: in the band's kept part, or in the bin(s) below ``k``
        where the running tempered weight passes ``u * Z2``."""
        cum_v = self.cum_v
        above = float(cum_v[kept.k - 1]) if kept.k else 0.0  # bins below k: all kept
        run = self.cumulative(above, kept.vals[: kept.j], temperature)
        target = u * float(run[-1])
        lo, hi = target * (1 - self.slack), target * (1 + self.slack)
        q_lo = min(int(np.searchsorted(run, lo, side="right")), kept.j)  # past the end: the book takes the last
        q_hi = min(int(np.searchsorted(run, hi, side="right")), kept.j)
        if q_lo != q_hi:
            return None
        if q_lo > 0:
            return int(kept.ids[q_lo - 1])
        k1, k2 = int(np.searchsorted(cum_v, lo, side="right")), int(np.searchsorted(cum_v, hi, side="right"))
        if k2 >= kept.k:
            return None
        ids, vals = self.band(k1, k2)
        run = self.cumulative(float(cum_v[k1 - 1]) if k1 else 0.0, vals, temperature)
        q_lo, q_hi = int(np.searchsorted(run, lo, side="right")), int(np.searchsorted(run, hi, side="right"))
        if q_lo != q_hi or not 0 < q_lo < len(run):
            return None
        return int(ids[q_lo - 1])
