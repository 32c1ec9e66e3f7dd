"""Grammar-constrained decoding that stays lossless with every drafter.

A request whose :class:`~localflash.speculative.sampling.SamplingParams` carries a ``grammar``
(GBNF text) samples every target row through a :class:`ConstrainedSampler`: the row is masked
by the grammar's state at that position (llama.cpp's grammar sampler, ``llama/grammar.py``), and
the request's own sampler then runs on the masked row — so acceptance is decided against the
constrained distribution, and a plain step (no draft) does exactly the same. The verify loop
samples rows in order and stops at the first mismatch, so the tokens sampled are exactly the
committed ones: the sampler's grammar state advances by committed tokens only.

Before a draft is verified, :meth:`ConstrainedSampler.trim` walks it on a clone of the committed
state and cuts it at the first token the grammar rejects (that token could never be accepted:
its constrained probability is 0), so no verify row is spent on it; the clone is then dropped,
which is the draft's rollback. Trees drop the rejected nodes the same way (:meth:`prune`, speculative/tree.py).

Rows rarely need a full mask (one grammar check of every token of the vocabulary): the row's top
tokens are checked first, in growing windows (``WINDOWS``; each a prefix of the (-logit, id) order,
ties at its edge included, in one grammar call). Greedy: the first allowed token is the masked
row's argmax. Sampled with top-k: the first ``top_k`` allowed tokens are the masked row's top-k
kept set, so the sampler runs on a row holding only them (the rest -inf), which gives the masked
row's token for the same uniform (top-p and min-p apply after top-k). Only when a window holds too
few allowed tokens, or top-k is off, is the whole row masked.
"""

from __future__ import annotations

import time

import numpy as np

from localflash.errors import GrammarError
from localflash.llama.grammar import GrammarState, schema_to_gbnf
from localflash.speculative.sampling import Sampler, SamplingParams

WINDOWS = (8, 64, 512, 4096)  # top tokens of a row tried, in turn, before the grammar masks the whole row


class ConstrainedSampler:
    """A request's sampler on grammar-masked rows; every sampled token is accepted into the grammar."""

    def __init__(self, model, params: SamplingParams):
        self.params = params
        self.inner = Sampler(params)
        self.state = GrammarState(model, params.grammar)
        self.rejected = 0  # draft tokens cut before verify (trim/prune)
        self.full_masks = 0  # rows masked over the whole vocabulary
        self.rows = 0
        self.seconds = 0.0  # host time spent here beyond the inner sampler's own
        self._row: np.ndarray | None = None  # a reused all -inf row (top-k sampling from a window)

    @property
    def paths(self) -> dict:
        return self.inner.paths

    def __call__(self, logits: np.ndarray) -> int:
        t0 = time.perf_counter()
        self.rows += 1
        p, n = self.params, logits.shape[0]
        want = 1 if p.greedy else p.top_k if 0 < p.top_k < n else 0
        hit = self._first_allowed(logits, want) if want else None
        if hit is not None and p.greedy:
            tok = int(hit[0])
        else:
            if hit is not None:  # the top-k kept set is the first top_k allowed tokens: the rest may as well be -inf
                row = self._row if self._row is not None and len(self._row) == n else np.full(n, -np.inf, np.float32)
                row[hit] = logits[hit]
            else:
                self.full_masks += 1
                row = self.state.mask(logits)
                if not np.isfinite(row).any():  # accepting any token now would abort llama.cpp
                    raise GrammarError("the grammar allows no token of this model's vocabulary here", param="grammar",
                                       hint="a rule needs text no token spells; test the grammar with llama.cpp's tools")
            t1 = time.perf_counter()
            tok = self.inner(row)
            t0 += time.perf_counter() - t1  # the sampler's own work is not the grammar's
            if hit is not None:
                row[hit] = -np.inf
                self._row = row
        self.state.accept(tok)
        self.seconds += time.perf_counter() - t0
        return tok

    def _first_allowed(self, logits: np.ndarray, want: int) -> np.ndarray | None:
        """The first ``want`` allowed tokens in (-logit, id) order, found in growing windows of the row's top
        (each a prefix of that order: ties at its edge included); None when the windows run out first."""
        n = logits.shape[0]
        for size in WINDOWS:
            if size < want:
                continue
            if size >= n // 2:
                return None
            edge = logits[np.argpartition(logits, n - size)[n - size]]
            ids = np.flatnonzero(logits >= edge)
            ids = ids[np.argsort(-logits[ids], kind="stable")]  # ids ascending, so ties stay in id order
            hit = ids[self.state.allowed(ids)]
            if len(hit) >= want:
                return hit[:want]
        return None

    def trim(self, draft: list[int]) -> list[int]:
        """The longest prefix of ``draft`` the grammar allows after the committed tokens."""
        if not draft:
            return draft
        t0 = time.perf_counter()
        probe = self.state.clone()
        try:
            for i, tok in enumerate(draft):
                if not probe.allows(tok):
                    self.rejected += len(draft) - i
                    return draft[:i]
                probe.accept(tok)
            return draft
        finally:
            self.state.calls += probe.calls
            probe.close()
            self.seconds += time.perf_counter() - t0

    def prune(self, tokens: list[int], parents: list[int]) -> list[bool]:
        """Which nodes of a token tree (node 0: the root, already committed; parents before children) the grammar allows."""
        t0 = time.perf_counter()
        keep = [True] * len(tokens)
        states: dict[int, GrammarState] = {0: self.state}
        try:
            for i in range(1, len(tokens)):
                parent = states.get(parents[i])
                if parent is None or not keep[parents[i]] or not parent.allows(tokens[i]):
                    keep[i] = False
                    self.rejected += 1
                    continue
                states[i] = parent.clone()
                states[i].accept(tokens[i])
        finally:
            for i, st in states.items():
                if i:
                    self.state.calls += st.calls
                    st.close()
            self.seconds += time.perf_counter() - t0
        return keep

    @property
    def calls(self) -> int:
        return self.state.calls

    def close(self) -> None:
        self.state.close()


def host_sampler(model, params: SamplingParams | None):
    """The host sampler of one request: constrained when its params carry a grammar."""
    if params is not None and params.grammar:
        return ConstrainedSampler(model, params)
    return Sampler(params)


def trim_draft(sample, draft: list[int]) -> list[int]:
    """``draft`` cut at the first token a constrained request's grammar rejects; as is for any other sampler."""
    return sample.trim(draft) if draft and isinstance(sample, ConstrainedSampler) else draft


def finish(sample, st) -> None:
    """A request ended: its grammar's counts go to ``st`` (Stats) and its parse state is freed."""
    if isinstance(sample, ConstrainedSampler):
        st.grammar_calls += sample.calls
        st.grammar_rejected += sample.rejected
        st.t_grammar += sample.seconds
        sample.close()


def compile_constraint(model, grammar: str | None = None, json_schema=None) -> str:
    """The GBNF text of a request's ``grammar`` or ``json_schema``, checked by compiling it on ``model``'s vocabulary."""
    if grammar is not None and json_schema is not None:
        raise GrammarError("pass grammar or json_schema, not both", param="grammar")
    param = "grammar" if grammar is not None else "json_schema"
    text = grammar if grammar is not None else schema_to_gbnf(json_schema, param)
    GrammarState(model, text, param=param).close()
    return text
