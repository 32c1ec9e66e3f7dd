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

Greedy rows need no full mask: the unconstrained argmax tokens are tried first (the top
``CANDIDATES`` by logit, ties by id, in one grammar call); the first allowed one is the masked
row's argmax. Only when none is allowed is the whole row masked. Sampled rows are always masked
whole (the kept set of top-k/top-p/min-p is the masked row's).
"""

from __future__ import annotations

import time

import numpy as np

from localflash.errors import GrammarError
from localflash.llama.grammar import GrammarState, schema_to_gbnf
from localflash.speculative.sampling import Sampler, SamplingParams

CANDIDATES = 8  # greedy: unconstrained top tokens tried before masking the whole row


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

    @property
    def paths(self) -> dict:
        return self.inner.paths

    def __call__(self, logits: np.ndarray) -> int:
        t0 = time.perf_counter()
        self.rows += 1
        tok = self._greedy(logits) if self.params.greedy else None
        if tok is None:
            self.full_masks += 1
            row = self.state.mask(logits)
            t1 = time.perf_counter()
            tok = self.inner(row)
            t0 += time.perf_counter() - t1  # the sampler's own work is not the grammar's
        self.state.accept(tok)
        self.seconds += time.perf_counter() - t0
        return tok

    def _greedy(self, logits: np.ndarray) -> int | None:
        """The masked row's argmax from the top candidates (None: none of them is allowed)."""
        n = logits.shape[0]
        if n <= CANDIDATES:
            return None
        edge = logits[np.argpartition(logits, n - CANDIDATES)[n - CANDIDATES]]
        ids = np.flatnonzero(logits >= edge)  # ties at the edge too: a prefix of the (-logit, id) order
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        i = self.state.first_allowed(ids)
        return None if i is None else int(ids[i])

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
