"""Sampling a context's output rows inside llama.cpp's graph (backend sampling, ``llama_set_sampler``).

With a sampler chain attached to a sequence (sequence 0 for one stream; each slot's own in a slot
pool: :meth:`InGraphSampling.sample_seq_in_graph`), every output row of that sequence is sampled
where it is computed, by that chain: only token ids come back (``llama_get_sampled_token_ith``),
and llama.cpp copies no logits to the host (``needs_raw_logits`` in src/llama-context.cpp is false
when every output row's sequence has a sampler; one row of a sequence without one brings the
logits of its whole micro-batch), so :meth:`Context.logits` has nothing to show afterwards. A
chain's stream is its own: a decode draws for a sequence only if it has output rows of it
(``llm_graph_input_sampling::set_input``), so other sequences' rows never move it.

The chain is llama.cpp's default order, as localflash's own sampler applies it: ``greedy`` alone
(temperature 0), else top-k, top-p, min-p (on the untempered logits), temperature, ``dist``.

The random stream (``dist`` in src/llama-sampler.cpp). With ``n_outputs_max_per_seq`` > 1 the
chain is *transactional*: every decode draws its output rows' uniforms, in row order, from a copy
of the generator taken at the start of that decode (``llama_sampler_backend_begin``), and
``llama_sampler_accept`` advances the real generator by one draw per committed token (at most as
many as that decode drew). So row i of a verify pass after c committed tokens draws uniform c + i,
the one plain decoding draws for that position, and rows never committed (rejected drafts,
calibration passes) leave the stream where it was: speculative output equals plain output of the
same seed on this path, token for token. Decodes without output rows draw nothing. With one
output row per sequence (``n_outputs_max`` 1) every decode draws from the real generator and
accept does nothing: the same stream as long as every output row decoded is committed, which
plain decoding does (a context made for drafts has more rows, so it is transactional).
"""

from __future__ import annotations

import weakref

from localflash.errors import LocalflashError
from localflash.llama.bindings import lib

LLAMA_TOKEN_NULL = -1


def chain_ptr(temperature: float, top_k: int, top_p: float, min_p: float, seed: int | None = None):
    """A new ``llama_sampler`` chain in llama.cpp's default order (caller frees it); greedy when ``temperature`` is 0.

    ``seed`` None: llama.cpp picks one at random (``LLAMA_DEFAULT_SEED``); others are taken mod 2^32.
    """
    L = lib()
    ptr = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    if temperature <= 0:
        parts = [L.llama_sampler_init_greedy()]
    else:
        parts = []
        if top_k > 0:
            parts.append(L.llama_sampler_init_top_k(top_k))
        if top_p < 1.0:
            parts.append(L.llama_sampler_init_top_p(top_p, 1))
        if min_p > 0.0:
            parts.append(L.llama_sampler_init_min_p(min_p, 1))
        s = L.LLAMA_DEFAULT_SEED if seed is None else seed & 0xFFFFFFFF
        parts += [L.llama_sampler_init_temp(temperature), L.llama_sampler_init_dist(s)]
    for p in parts:
        L.llama_sampler_chain_add(ptr, p)
    return ptr


GREEDY = ("greedy",)  # the settings key of a greedy chain (no random stream: nothing to accept)


class InGraphSampling:
    """:class:`~localflash.llama.runtime.Context` methods: a sequence's rows sampled in llama.cpp's graph.

    Each sequence may carry a chain of its own (``llama_set_sampler`` takes one per sequence id):
    the one-stream loop uses sequence 0's (:meth:`sample_in_graph`), a slot pool each slot's
    (:meth:`sample_seq_in_graph`, through its :class:`~localflash.llama.sequences.SeqView`). The
    context keeps the chains it samples with alive (``_chains``, freed after the context).
    """

    def _init_graph_sampling(self) -> None:
        self._chains: dict = {}  # sequence -> its attached chain, freed after the context
        self._keys: dict = {}  # sequence -> the settings of its chain

    def _finalizer(self) -> weakref.finalize:
        return weakref.finalize(self, _free_context_and_chains, self.ptr, self._chains)

    @property
    def _graph_key(self):
        """Sequence 0's chain settings; None: its rows go to the host."""
        return self._keys.get(0)

    @property
    def samples_in_graph(self) -> bool:
        """Whether sequence 0's output rows are sampled in the graph (no logits reach the host)."""
        return 0 in self._keys

    def sample_in_graph(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                        seed: int | None = None) -> bool:
        """Sample every output row of sequence 0 in the graph with these settings, from a fresh stream of ``seed``.

        The same settings as the attached chain's: the chain is reset (its generator back to
        ``seed``; no graph rebuild). Other settings: a new chain replaces it, and every other
        sequence's chain goes too (llama.cpp reserves its graphs again at the next decode).
        Returns False where the backend cannot take the chain; sequence 0's rows then go to the host again.
        """
        key = _key(temperature, top_k, top_p, min_p, seed)
        if key == self._keys.get(0):
            lib().llama_sampler_reset(self._chains[0])
            return True
        self._release_chain()  # detached first: every attached chain (other sequences' greedy ones too) goes
        return self._attach(0, key, chain_ptr(temperature, top_k, top_p, min_p, seed))

    def sample_seq_in_graph(self, seq: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                            min_p: float = 0.0, seed: int | None = None) -> bool:
        """:meth:`sample_in_graph` for sequence ``seq`` alone: the other sequences' chains stay as they are."""
        key = _key(temperature, top_k, top_p, min_p, seed)
        if key == self._keys.get(seq):
            lib().llama_sampler_reset(self._chains[seq])
            return True
        self.sample_seq_on_host(seq)
        return self._attach(seq, key, chain_ptr(temperature, top_k, top_p, min_p, seed))

    def _attach(self, seq: int, key: tuple, chain) -> bool:
        L = lib()
        if not L.llama_set_sampler(self.ptr, seq, chain):
            L.llama_sampler_free(chain)
            return False
        self._chains[seq], self._keys[seq] = chain, key
        return True

    def sample_greedy_in_graph(self, n_seq: int = 1) -> bool:
        """Take every output row's argmax inside llama.cpp's graph, for sequences ``0..n_seq-1`` (a greedy chain
        each: a slot pool's shared drafter context); read the ids with :meth:`sampled`."""
        if not self.sample_in_graph():
            return False
        for seq in range(1, n_seq):
            if seq not in self._chains and not self._attach(seq, GREEDY, chain_ptr(0.0, 0, 1.0, 0.0)):
                self.sample_on_host()
                return False
        return True

    def sample_on_host(self) -> None:
        """Detach every chain: decodes copy logits to the host again."""
        if self._chains:
            self._release_chain()

    def sample_seq_on_host(self, seq: int) -> None:
        """Detach sequence ``seq``'s chain: its rows' logits reach the host again (and with them those of every
        other output row of a micro-batch that holds one of its rows: llama.cpp's ``needs_raw_logits``)."""
        chain = self._chains.pop(seq, None)
        if chain is not None:
            del self._keys[seq]
            lib().llama_set_sampler(self.ptr, seq, None)
            lib().llama_sampler_free(chain)

    def _release_chain(self) -> None:
        for seq in list(self._chains):
            self.sample_seq_on_host(seq)

    def sampled(self, row: int = -1) -> int:
        """The token the in-graph chain chose for output row ``row`` (a batch index; -1: the last real row)."""
        tok = lib().llama_get_sampled_token_ith(self.ptr, self._last_row if row == -1 else row)
        if tok == LLAMA_TOKEN_NULL:
            raise LocalflashError(f"llama.cpp sampled no token for row {row} in its graph",
                                  hint="the backend could not run the whole sampler chain: load with --sample-in-graph off")
        return tok

    def sampled_rows(self, lo: int, hi: int) -> list[int]:
        """:meth:`sampled` of output rows ``lo..hi-1`` (a DFlash block's drafts): one read of the ids where every row
        of the last decode was an output (``outputs.py``), else one binding call a row."""
        view = self._sampled_view()
        if view is not None and self._outs[1] and hi <= self._outs[0]:
            toks = view[lo:hi]
        else:
            get, ptr = lib().llama_get_sampled_token_ith, self.ptr
            toks = [get(ptr, i) for i in range(lo, hi)]
        if LLAMA_TOKEN_NULL in toks:
            return [self.sampled(i) for i in range(lo, hi)]  # raises the clear error
        return toks

    def verify_sampled(self, draft: list[int], eog) -> list[int]:
        """The verify step on the in-graph ids: rows 0.. read until the first that differs from ``draft`` (or is in
        the set ``eog``); returns the committed tokens (accepted drafts + the target's own) and accepts them into the
        chain. No draft: the last real row. All rows' ids in one read (``outputs.py``), compared as lists: no
        Python call per row."""
        n = len(draft)
        view = self._sampled_view()
        if view is None or (n and not self._outs[1]) or (not n and self._last_row != -1):
            return self._verify_rows(draft, eog)
        new = committed(view[: n + 1], draft, eog) if n else [view[-1]]  # (an end of generation: a set test a row, no call)
        if LLAMA_TOKEN_NULL in new:
            return self._verify_rows(draft, eog)  # raises the clear error
        self.accept_sampled(new)
        return new

    def _verify_rows(self, draft: list[int], eog) -> list[int]:
        """:meth:`verify_sampled` one binding call a row (a layout the output buffer's start does not give)."""
        get, ptr = lib().llama_get_sampled_token_ith, self.ptr
        n = len(draft)
        if not n:
            tok = get(ptr, self._last_row)
            i = 0
        else:
            i = 0
            while True:
                tok = get(ptr, i)
                if i == n or tok != draft[i] or tok in eog:
                    break
                i += 1
        if tok == LLAMA_TOKEN_NULL:
            self.sampled(i if n else -1)  # raises the clear error
        new = draft[:i] + [tok]
        self.accept_sampled(new)
        return new

    def accept_sampled(self, tokens, seq: int = 0) -> None:
        """Commit ``tokens`` to sequence ``seq``'s chain: its generator advances one draw per token (see the module
        docstring); a greedy chain has no stream to advance."""
        key = self._keys.get(seq)
        if key is not None and key != GREEDY:
            accept, chain = lib().llama_sampler_accept, self._chains[seq]
            for t in tokens:
                accept(chain, t)


def _key(temperature: float, top_k: int, top_p: float, min_p: float, seed: int | None) -> tuple:
    return GREEDY if temperature <= 0 else (float(temperature), int(top_k), float(top_p), float(min_p), seed)


def committed(ids: list[int], draft: list[int], eog) -> list[int]:
    """The verify rule on a verify pass's in-graph ids (``ids[i]``: row i's, ``len(draft) + 1`` of them): drafts
    kept while they equal the ids, then the target's own; cut after the first end of generation (in the set ``eog``)."""
    n = len(draft)
    if ids[:n] == draft:
        new = ids[: n + 1]
    else:
        i = 0
        while ids[i] == draft[i]:
            i += 1
        new = ids[: i + 1]
    i = 0
    for t in new:
        if t in eog:
            return new[: i + 1]
        i += 1
    return new


def _free_context_and_chains(ctx, chains: dict) -> None:
    """The context first: it refers to its chains."""
    lib().llama_free(ctx)
    for chain in chains.values():
        lib().llama_sampler_free(chain)
    chains.clear()


def logits_bytes_to_host(rows: int, n_vocab: int, in_graph: bool) -> int:
    """Bytes of a decode's output that cross to the host for ``rows`` output rows.

    The host path: llama.cpp copies every output row's logits (``rows x n_vocab`` float32),
    however few of them the verify step then reads. In the graph: one int32 token id per row.
    """
    return rows * 4 if in_graph else rows * n_vocab * 4
