"""Turning one row of target logits into one token, at a cost that does not grow with the vocabulary.

The filters run in llama.cpp's order (top-k, top-p, min-p on the untempered
distribution, then temperature). Each sampled position consumes exactly one
uniform draw from the request's generator, so a speculative run that samples
row by row and accepts a draft token only when it equals the target's sample
("sample and match") emits the *same* tokens as plain sampling with the same
seed — the strongest form of "follows the target's distribution exactly".

Candidates in sorted order (descending logit, ties by id) are all a sampler
needs, and they form a prefix of the sorted vocabulary. :func:`kept_set` finds
that prefix without sorting the vocabulary: it picks a threshold that about
``window`` tokens pass (from a strided sample of the row), takes every token at
or above it (one compare pass), sorts only those, and checks that they provably
contain the kept set — ``top_k`` of them; for top-p without top-k a cut that is
the same for every normaliser ``Z`` the tokens below the threshold allow (each
of them weighs less than ``exp(threshold - top)``), else the same under the
exact ``Z`` (one exp pass); the ``min_p`` threshold is explicit. When the check
fails the window grows eightfold, up to the whole vocabulary. So the result is
exactly :func:`reference_distribution`'s, only cheaper. The :class:`Sampler`
does not sort a kept set (top-k off) that needs more than ``FLAT_FROM`` tokens:
:mod:`~localflash.speculative.sampling_flat` draws the same token from such a
flat row without a sort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from localflash.errors import LocalflashError
from localflash.speculative.sampling_flat import sample_flat

WINDOW = 256  # tokens in the first candidate window (top-k: at least 4 k)
STRIDE = 16  # the window's threshold comes from every STRIDE-th logit
Z_SLACK = 1e-9  # relative: two float64 sums of n <= 4e6 non-negative terms differ by at most 2 n 2^-53 < 1e-9
FLAT_FROM = 2048  # the Sampler takes a kept set (top-k off) that needs a longer window as a flat row (sampling_flat)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    grammar: str | None = None  # GBNF text: every row is masked by it (speculative/grammar.py)

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


def reference_distribution(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The filtered distribution by the book: sort the whole vocabulary (slow; the tests' reference)."""
    ids, vals = _book(logits, p)
    return ids, _tempered(vals, p.temperature)


def reference_sample(logits: np.ndarray, p: SamplingParams, u: float) -> int:
    """The book's token at uniform ``u``: the inverse CDF over the book's kept set."""
    ids, vals = _book(logits, p)
    return int(ids[_draw(vals, p.temperature, u)])


def _book(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Kept ids (descending logit, ties by id) and their float64 logits, from a sort of the whole vocabulary."""
    n = logits.shape[0]
    if 0 < p.top_k < n:
        ids = np.argpartition(-logits, p.top_k - 1)[: p.top_k]
        # argpartition splits ties at the k-th value arbitrarily: take them by id, as the sort below does
        kth = logits[ids].min()
        above = np.flatnonzero(logits > kth)
        ties = np.flatnonzero(logits == kth)[: p.top_k - len(above)]
        ids = np.concatenate([above, ties])
    else:
        ids = np.arange(n)
    vals = logits[ids].astype(np.float64)
    order = np.lexsort((ids, -vals))
    ids, vals = ids[order], vals[order]
    keep = _keep(vals, p)
    return ids[:keep], vals[:keep]


def _keep(vals: np.ndarray, p: SamplingParams) -> int:
    """How many of the sorted ``vals`` top-p and min-p keep (``vals``: every candidate left after top-k).

    Top-p: the shortest prefix whose cumulative weight reaches ``top_p`` of the total, on the
    sequential cumulative sum of ``exp(vals - vals[0])`` (its last entry is the total); min-p:
    weights of at least ``min_p`` (relative to the top token's), as llama.cpp does.
    """
    keep = len(vals)
    if p.top_p < 1.0 or p.min_p > 0.0:
        w = np.exp(vals - vals[0])
        if p.top_p < 1.0:
            cum = np.cumsum(w)
            keep = min(keep, int(np.searchsorted(cum, p.top_p * cum[-1])) + 1)
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(w >= p.min_p)))
    return max(keep, 1)


def _tempered(vals: np.ndarray, temperature: float) -> np.ndarray:
    probs = np.exp((vals - vals[0]) / temperature)
    return probs / probs.sum()


def _draw(vals: np.ndarray, temperature: float, u: float) -> int:
    """Index of the token at ``u`` of the tempered distribution over the sorted ``vals`` (inverse CDF)."""
    cum = np.cumsum(np.exp((vals - vals[0]) / temperature))
    return min(int(np.searchsorted(cum, u * cum[-1], side="right")), len(vals) - 1)


def kept_set(logits: np.ndarray, p: SamplingParams, window: int = WINDOW,
             most: int | None = None) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """Kept token ids (sorted) and their logits (float64), and how they were found.

    ``how`` is ``window`` (the first window sufficed), ``exact-z`` (top-p needed
    the exact normaliser), ``wider`` (a wider window) or ``full`` (the whole vocabulary).
    With ``most``, a kept set (top-k off) that needs a window of more than ``most``
    tokens is not sorted: (None, None, ``flat``), for :func:`sample_flat`.
    """
    n = logits.shape[0]
    k = p.top_k if 0 < p.top_k < n else 0
    if not k and p.top_p >= 1.0 and p.min_p > 0.0:  # min-p alone: an explicit threshold (a little low; _keep cuts)
        top = float(logits.max())
        cand = np.flatnonzero(logits >= top + math.log(p.min_p) - 1e-3)
        if most and len(cand) > most:
            return None, None, "flat"
        ids, vals, _ = _prefix(logits, cand, top, count=len(cand))
        m = _keep(vals, p)
        return ids[:m], vals[:m], "window"
    z_exact = None
    how = "window"
    want = max(window, 4 * k)
    while True:
        thr = _threshold(logits, want)
        cand = np.arange(n) if thr is None else np.flatnonzero(logits >= thr)
        top = float(logits.max() if thr is None else logits[cand].max())  # the threshold is a logit of the row
        whole = len(cand) == n
        if k and (len(cand) >= k or whole):
            ids, vals, _ = _prefix(logits, cand, top, count=k)
            ids, vals = ids[:k], vals[:k]
            m = _keep(vals, p)
            return ids[:m], vals[:m], how
        if not k and p.top_p < 1.0:
            # the cut under the normaliser's bounds (window sum .. plus every left-out token at the threshold),
            # then under the exact normaliser's; a cut the margin leaves open is taken the book's way
            s_window = float(np.exp(logits[cand].astype(np.float64) - top).sum())
            got = "short"
            if z_exact is None:
                tail = 0.0 if whole else (n - len(cand)) * math.exp(float(thr) - top)
                got = _top_p_cut(logits, cand, top, p, s_window, s_window + tail, s_window)
                if most and got == "short" and 8 * s_window < p.top_p * _sampled_normaliser(logits, top):
                    return None, None, "flat"  # a window 8x as long holds at most 8x the mass: far short
                if got in ("short", "open") and not whole:
                    z_exact = _normaliser(logits, top)
                    how = "exact-z"
            if z_exact is not None:
                got = _top_p_cut(logits, cand, top, p, z_exact, z_exact, s_window)
            if got == "open" or (got == "short" and whole):
                ids, vals = _book(logits, p)
                return ids, vals, "full"
            if got != "short":
                ids, vals = got
                return ids, vals, how
        if whole:  # top-p 1 and min-p 0 (the reference's unfiltered case)
            ids, vals, _ = _prefix(logits, cand, top, count=n)
            return ids, vals, "full"
        want *= 8
        if most and not k and want > most:
            return None, None, "flat"
        how = "wider" if want < n // 4 else "full"


def _top_p_cut(logits, cand, top: float, p: SamplingParams, z_lo: float, z_hi: float, s_window: float):
    """The top-p (then min-p) kept set within ``cand`` if it is the same for every normaliser in
    ``[z_lo, z_hi]`` widened by ``Z_SLACK``: (ids, vals); ``"short"`` when ``cand`` may hold less than
    ``top_p`` of the mass, ``"open"`` when the bounds allow two cuts."""
    lo_mass, hi_mass = p.top_p * z_lo * (1 - Z_SLACK), p.top_p * z_hi * (1 + Z_SLACK)
    if hi_mass > s_window * (1 - Z_SLACK):
        return "short"
    ids, vals, cum = _prefix(logits, cand, top, mass=hi_mass)
    lo = int(np.searchsorted(cum, lo_mass)) + 1
    if lo != int(np.searchsorted(cum, hi_mass)) + 1 or lo > len(ids):
        return "open"
    m = _keep(vals[:lo], replace_top_p(p))  # min-p on top
    return ids[:m], vals[:m]


def _threshold(logits: np.ndarray, want: int):
    """A logit that about ``want`` tokens reach (from a strided sample); None: take them all."""
    n = logits.shape[0]
    if want >= n // 4:
        return None
    sample = logits[::STRIDE]
    j = min(len(sample) - 1, want // STRIDE + 1)
    return np.partition(sample, len(sample) - 1 - j)[len(sample) - 1 - j]


def _sampled_normaliser(logits: np.ndarray, top: float) -> float:
    """An estimate of sum(exp(logits - top)) from every STRIDE-th logit."""
    return STRIDE * float(np.exp(logits[::STRIDE].astype(np.float64) - top).sum())


_buffers: dict[int, np.ndarray] = {}


def _normaliser(logits: np.ndarray, top: float) -> float:
    """sum(exp(logits - top)) in float64 (each term the book's own), in one pass through a reused buffer
    (fresh 1-2 MB arrays cost page faults)."""
    buf = _buffers.get(logits.shape[0])
    if buf is None:
        buf = _buffers[logits.shape[0]] = np.empty(logits.shape[0], np.float64)
    np.subtract(logits, top, out=buf, dtype=np.float64)
    np.exp(buf, out=buf)
    return float(buf.sum())


def _prefix(logits: np.ndarray, cand: np.ndarray, top: float, count: int = 0, mass: float = 0.0):
    """The start of ``cand`` in sorted order, long enough to hold ``count`` tokens or weigh ``mass``.

    ``cand`` must be every token above some value (a prefix of the sorted vocabulary, in id order).
    Sorts only what is needed: the top 64, 256, ... by partition, all ties at the edge included.
    Returns ids, logits (float64) and cumulative weights exp(logit - top).
    """
    vals = logits[cand]
    j = max(count, 64)
    while True:
        if j < len(cand):
            edge = vals[np.argpartition(-vals, j - 1)[j - 1]]
            sel = np.flatnonzero(vals >= edge)  # ties at the edge too: still a prefix of the sorted order
        else:
            sel = np.arange(len(cand))
        ids, v = _sorted(logits, cand[sel])
        cum = np.cumsum(np.exp(v - top))
        if len(sel) == len(cand) or (len(ids) >= count and cum[-1] >= mass):
            return ids, v, cum
        j *= 4


def _sorted(logits: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` (ascending) by descending logit, ties by id; their logits as float64."""
    vals = logits[ids].astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    return ids[order], vals[order]


def sample_unfiltered(logits: np.ndarray, temperature: float, u: float, window: int = WINDOW) -> tuple[int, str]:
    """The token at ``u`` of the whole tempered distribution (no top-k/top-p/min-p), and how it was found.

    Inverse CDF in sorted order over a window of about ``window`` tokens when the
    tokens below it (each weighing < exp((threshold - top)/T)) cannot move ``u``'s
    token for any normaliser they allow (widened by ``Z_SLACK``); else as a flat row
    (:func:`sample_flat`: ``flat``), or, where that is left open, the book's way over the whole vocabulary.
    """
    n = logits.shape[0]
    thr = _threshold(logits, window)
    if thr is not None:
        ids, vals = _sorted(logits, np.flatnonzero(logits >= thr))
        top = float(vals[0])
        cum = np.cumsum(np.exp((vals - top) / temperature))  # the book's cumulative sums, as far as the window goes
        z_lo = float(cum[-1])
        z_hi = z_lo + (n - len(ids)) * math.exp((float(thr) - top) / temperature)
        lo = int(np.searchsorted(cum, u * z_lo * (1 - Z_SLACK), side="right"))
        if lo == int(np.searchsorted(cum, u * z_hi * (1 + Z_SLACK), side="right")) and lo < len(ids):
            return int(ids[lo]), "window"
    tok, _ = sample_flat(logits, 1.0, 0.0, temperature, u)
    if tok is not None:
        return tok, "flat"
    ids, vals = _sorted(logits, np.arange(n))
    return int(ids[_draw(vals, temperature, u)]), "full"


def replace_top_p(p: SamplingParams) -> SamplingParams:
    """``p`` without its top-p (already applied)."""
    return SamplingParams(p.temperature, p.top_k, 1.0, p.min_p, p.seed)


def filtered_distribution(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Candidate token ids and their probabilities after top-k/top-p/min-p and temperature.

    Ids come sorted by descending logit (ties by id), so the result is deterministic.
    """
    ids, vals, _ = kept_set(logits, p)
    return ids, _tempered(vals, p.temperature)


class Sampler:
    """Samples target rows for one request; greedy when temperature is 0."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)
        # how each sampled row's token was found: kept_set's ``how``, ``flat`` (sample_flat), ``flat-open``
        # (a flat row whose decision fell within rounding of a boundary: the book's sort)
        self.paths: dict[str, int] = {}
        self._flat = False  # the last row went to sample_flat and was flat
        self._mask: np.ndarray | None = None  # a reused compare buffer (a fresh 250 KB one costs page faults)

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(logits.argmax())
        p = self.params
        u = self.rng.random()  # one draw per sampled position, always
        top_k_off = not (0 < p.top_k < logits.shape[0])
        if not self._flat and (p.min_p > 0.0 or p.top_p < 1.0):
            tok = self._lone(logits)
            if tok is not None:
                self.paths["lone"] = self.paths.get("lone", 0) + 1
                return tok
        if top_k_off and self._flat:  # the last row was flat: so, likely, is this one; no window first
            tok, how = self._flat_row(logits, u)
        elif top_k_off and p.top_p >= 1.0 and p.min_p <= 0.0:
            tok, how = sample_unfiltered(logits, p.temperature, u)
            self._flat = how == "flat"
        else:
            ids, vals, how = kept_set(logits, p, most=FLAT_FROM)
            if ids is None:
                tok, how = self._flat_row(logits, u)
            else:
                tok = int(ids[_draw(vals, p.temperature, u)])
        self.paths[how] = self.paths.get(how, 0) + 1
        return tok

    def _lone(self, logits: np.ndarray) -> int | None:
        """The top token when the filters provably keep it alone (a peaked row), else None.

        Min-p keeps it alone when no other logit comes within ``log(min_p)`` of the top (checked
        with 1e-3 to spare: the book compares float64 weights); top-p when the top token alone
        already weighs ``top_p`` of every normaliser the row allows: the tokens at or above
        ``top + log(delta)`` summed exactly, each one below weighing less than ``delta``. A lone
        token is drawn whatever the uniform (which the caller has drawn), so the draw is the book's.
        Ties at the top never pass either test (the tied token has weight 1).
        """
        n = logits.shape[0]
        mask = self._mask
        if mask is None or mask.shape[0] != n:
            mask = self._mask = np.empty(n, np.bool_)
        i = int(np.argmax(logits))
        top = float(logits[i])
        p = self.params
        if p.min_p > 0.0:
            np.greater_equal(logits, top + math.log(p.min_p) - 1e-3, out=mask)
            if np.count_nonzero(mask) == 1:
                return i
        if p.top_p < 1.0:
            delta = (1.0 / p.top_p - 1.0) / (2.0 * n)  # the tokens below add at most half the room
            np.greater_equal(logits, top + math.log(delta), out=mask)
            cand = np.flatnonzero(mask)
            if 1 <= len(cand) <= WINDOW:  # the top itself among them (not a NaN row)
                z_hi = float(np.exp(logits[cand].astype(np.float64) - top).sum()) + (n - len(cand)) * delta
                if p.top_p * z_hi * (1.0 + Z_SLACK) < 1.0:  # cum[0] = 1 >= top_p * Z for every Z the row allows
                    return i
        return None

    def _flat_row(self, logits: np.ndarray, u: float) -> tuple[int, str]:
        p = self.params
        tok, self._flat = sample_flat(logits, p.top_p, p.min_p, p.temperature, u)
        if tok is None:
            return reference_sample(logits, p, u), "flat-open"
        return tok, "flat"
