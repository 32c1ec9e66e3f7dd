"""One sequence of a multi-sequence context, seen as a context of its own.

A :class:`SeqView` addresses sequence ``seq`` of a :class:`~localflash.llama.runtime.Context`
made with ``n_seq_max > 1``. It has the interface the draft–verify loop and the drafters
use on a target context (``decode``, ``logits``, ``all_logits``, ``layer_input``,
``last_tokens``, ``n_last``, the cuts of :class:`~localflash.llama.rollback.RecurrentCache`),
so an :class:`~localflash.speculative.loop.Engine` and any drafter run on it unchanged.

Its own decodes carry only its rows. After a decode that carried rows of several
sequences (:func:`decode_views`), each view is pointed at its slice of that batch
(:meth:`SeqView.took`): its logits, layer inputs and nextn rows are then the ones of
its rows, until the next target decode. Rollback state (the end, a pending snapshot
cut, checkpoints) is per view, as llama.cpp keeps recurrent state per sequence.
"""

from __future__ import annotations

import ctypes

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama.bindings import ext, lib, lib_address
from localflash.llama.graph_sampling import GREEDY, LLAMA_TOKEN_NULL, committed
from localflash.llama.views import address_view, float_view
from localflash.llama.rollback import RecurrentCache


class SeqView(RecurrentCache):
    """Sequence ``seq`` of ``ctx``; a share of ``ctx.n_ctx_seq`` positions."""

    def __init__(self, ctx, seq: int, n_ubatch: int = 512):
        if not 0 <= seq < ctx.n_seq_max:
            raise ValueError(f"sequence {seq} outside the context's 0..{ctx.n_seq_max - 1}")
        self.base = ctx
        self.model = ctx.model
        self.ptr = ctx.ptr
        self.mem = ctx.mem
        self.seq = seq
        self.min_rows = ctx.min_rows
        self.n_ctx = ctx.n_ctx_seq
        self.n_batch = ctx.n_batch
        self.n_outputs_max = ctx.n_outputs_max
        self.n_last = 0
        self._row0 = 0  # this view's first row in the last decode's batch
        self._out0 = 0  # ... and its first output row
        self._n_out = 0
        self._last_row = -1  # batch index of the row logits(-1) reads
        self._rows = ctx.__dict__.setdefault("_view_rows", [-1, None])  # (decode number, its output rows' view)
        self._init_rollback(False, n_ubatch)

    # -- decoding -----------------------------------------------------------
    def decode(self, tokens, start_pos: int, outputs: str = "last") -> int:
        """Decode ``tokens`` of this sequence alone (prefill, replay, a lone step); as ``Context.decode``."""
        n = len(tokens)
        pad = self.min_rows - n if n < self.min_rows else 0
        toks = list(tokens) + [tokens[-1]] * pad
        pos = np.arange(start_pos, start_pos + n + pad, dtype=np.int32)
        if outputs == "all":
            flags = [1] * (n + pad)
        else:
            flags = [0] * (n + pad)
            if outputs == "last":
                flags[n - 1] = 1
                flags[n:] = [1] * pad  # padding rows are output too: the head multiplies a batch
        self.base.decode_rows(toks, pos, [self.seq] * (n + pad), flags)
        self._decoded(start_pos, n + pad)
        if pad:
            self.seq_rm(start_pos + n)
        n_out = n if outputs == "all" else int(outputs == "last")
        self.took(0, 0, n, n_out)
        return n_out

    def decode_embd(self, parts, start_pos: int, n: int | None = None) -> None:
        """Float input rows of this sequence alone (a drafter's features), as ``Context.decode_embd``."""
        if type(parts) is np.ndarray and parts.ndim == 3:  # [rows, taps, width] (Context.layer_input_rows)
            rows = parts.shape[0]
        else:
            parts = [parts] if isinstance(parts, np.ndarray) else list(parts)
            rows = parts[0].shape[0]
        decode_embd_views(self.base, [(self, parts, start_pos, rows if n is None else n)])

    def took(self, row0: int, out0: int, n: int, n_out: int) -> None:
        """The last target decode gave this sequence rows ``row0..row0+n-1``, outputs ``out0..``."""
        self._row0, self._out0, self.n_last, self._n_out = row0, out0, n, n_out
        self._last_row = row0 + n - 1

    def last_tokens(self) -> np.ndarray:
        return self.base._batch.token[self._row0 : self._row0 + self.n_last]

    def sampled_rows(self, lo: int, hi: int) -> list[int]:
        """The ids the base context's in-graph chain drew for this view's rows ``lo..hi-1`` of the last decode."""
        return self.base.sampled_rows(self._row0 + lo, self._row0 + hi)

    # -- this sequence's rows sampled in the graph (a chain of its own: graph_sampling.py) --------
    def sample_in_graph(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                        seed: int | None = None) -> bool:
        """This sequence's rows sampled in the graph by a chain of these settings (a fresh stream of ``seed``)."""
        return self.base.sample_seq_in_graph(self.seq, temperature, top_k, top_p, min_p, seed)

    def sample_on_host(self) -> None:
        self.base.sample_seq_on_host(self.seq)

    @property
    def samples_in_graph(self) -> bool:
        return self.seq in self.base._keys

    def sampled(self, row: int = -1) -> int:
        """The id this sequence's chain drew for its output row ``row`` of the last decode (-1: its last row)."""
        return self.base.sampled(self._last_row if row == -1 else self._row0 + row)

    def accept_sampled(self, tokens) -> None:
        self.base.accept_sampled(tokens, self.seq)

    def verify_sampled(self, draft: list[int], eog) -> list[int]:
        """``Context.verify_sampled`` on this view's rows: its ids are a slice of the decode's ids by output row
        (its rows all outputs with a draft, its last row without), read in one go where the layout is known."""
        n = len(draft)
        view = self.base._sampled_view()
        if view is not None and self._n_out == n + 1:
            ids = view[self._out0 : self._out0 + n + 1]
        else:
            get, ptr = lib().llama_get_sampled_token_ith, self.ptr
            ids = [get(ptr, self._row0 + i) for i in range(n)] + [get(ptr, self._last_row)]
        new = committed(ids, draft, eog)
        if LLAMA_TOKEN_NULL in new:
            self.sampled(len(new) - 1 if n else -1)  # raises the clear error
        base, seq = self.base, self.seq
        if base._keys.get(seq) != GREEDY:  # (accept_sampled, inline: a slot's verify runs every step)
            accept, chain = lib().llama_sampler_accept, base._chains[seq]
            for t in new:
                accept(chain, t)
        return new

    def logits(self, row: int = -1) -> np.ndarray:
        """Logits of this view's output row ``row`` (-1: its last row) of the last decode."""
        i = self._last_row if row == -1 else self._row0 + row
        address = lib_address("llama_get_logits_ith")(self.ptr, i)
        if not address:
            raise LocalflashError("no logits for that row")
        return address_view(address, (self.model.n_vocab,))

    def all_logits(self) -> np.ndarray:
        """This view's output rows of the last decode: a slice of one view of the whole batch's rows, read from
        llama.cpp once a decode for every view (``_rows``: shared by the views of one context)."""
        rows, base = self._rows, self.base
        if rows[0] != base.n_decodes:
            full = lib_address("llama_get_logits")(self.ptr)
            rows[0], rows[1] = base.n_decodes, address_view(full, (base._n_out, self.model.n_vocab))
        return rows[1][self._out0 : self._out0 + self._n_out]

    def layer_input(self, lid: int, n_rows: int) -> np.ndarray:
        return self.layer_inputs((lid,), n_rows)[0]

    def layer_inputs(self, layer_ids, n_rows: int) -> list[np.ndarray]:
        """:meth:`layer_input` of each of ``layer_ids`` (what a DFlash drafter injects per cycle): the base
        context's cached views of the whole batch (one shape a decode for every view, so the views are made once
        a decode, not once a slot), sliced to this view's rows."""
        r0 = self._row0
        return [v[r0 : r0 + n_rows] for v in self.base.layer_inputs(layer_ids, self.base.n_last)]

    def layer_input_rows(self, layer_ids, n_rows: int):
        """:meth:`layer_inputs` side by side where the base context gives them so (``Context.layer_input_rows``)."""
        r0 = self._row0
        v = self.base.layer_input_rows(layer_ids, r0 + n_rows)
        return v[r0:] if type(v) is np.ndarray else [x[r0:] for x in v]

    def nextn_rows(self, n_rows: int) -> np.ndarray:
        """Unmasked nextn hidden states of this view's rows of the last decode."""
        ptr = ext().llama_get_embeddings_nextn(self.ptr)
        if not ptr:
            raise LocalflashError("no nextn hidden states", hint="enable_nextn(ctx) before decoding")
        return float_view(ptr, (self._row0 + n_rows, self.model.n_embd))[self._row0 :]

    def capture_layer_inputs(self, layer_ids: list[int]) -> None:
        self.base.capture_layer_inputs(layer_ids)

    # -- memory -------------------------------------------------------------
    def pos_max(self) -> int:
        return lib().llama_memory_seq_pos_max(self.mem, self.seq)

    def clear(self) -> None:
        """Empty this sequence only."""
        lib().llama_memory_seq_rm(self.mem, self.seq, -1, -1)
        self._cleared()

    def save_state(self):
        """This sequence's cells (positions, K/V rows) copied to host memory (``llama_state_seq_get_data``): a ctypes
        byte array for :meth:`load_state`, or None where llama.cpp could not. Attention caches (a recurrent state
        goes through :meth:`checkpoint`)."""
        L = lib()
        size = L.llama_state_seq_get_size(self.ptr, self.seq)
        if not size:
            return None
        data = (ctypes.c_uint8 * size)()
        return data if L.llama_state_seq_get_data(self.ptr, data, size, self.seq) == size else None

    def load_state(self, data) -> bool:
        """Put a :meth:`save_state` copy back into this sequence (in whatever cells are free); whether it went in whole.
        On False the sequence is empty (llama.cpp drops what a failed restore put in)."""
        L = lib()
        if not L.llama_state_seq_set_data(self.ptr, data, len(data), self.seq):
            self.clear()
            return False
        n = self.pos_max() + 1
        self._cleared()
        self._decoded(0, n)
        return True

    def close(self) -> None:
        """The shared context outlives its views (its owner closes it)."""


def decode_views(ctx, parts: list[tuple[SeqView, list[int], int, bool | str]]) -> None:
    """One decode carrying every part's rows: ``(view, tokens, start_pos, outputs)``.

    ``outputs``: ``"all"`` (or True), ``"last"`` (or False: its last row) or ``"none"``. Afterwards each
    view reads its own rows (:meth:`SeqView.took`). The rows go straight into the context's batch arrays
    (slice copies a part; positions and sequence ids filled for all parts at once: no Python per row).
    With exact numerics (``min_rows`` 2) a batch of one row is padded as a lone decode would be, and the
    padding cut off again.
    """
    b = ctx._batch
    tok, flags, cap = b.token, b.logits, b.capacity
    meta = np.empty((3, len(parts)), np.int64)  # each part's position offset (start - first row), rows, sequence
    r = n_out = 0
    for j, (view, tokens, start, outputs) in enumerate(parts):
        n = len(tokens)
        if r + n > cap:
            raise ValueError(f"batch of {r + n}+ tokens exceeds n_batch={ctx.n_batch}")
        tok[r : r + n] = tokens
        if outputs is True or outputs == "all":
            flags[r : r + n] = 1
            outs = n
        else:
            flags[r : r + n] = 0
            outs = 1 if outputs is False or outputs == "last" else 0
            if outs:
                flags[r + n - 1] = 1
        meta[0, j], meta[1, j], meta[2, j] = start - r, n, view.seq
        view._taking = (r, n_out, n, outs, start)  # (set on the view once the decode went through)
        r += n
        n_out += outs
    pad = ctx.min_rows - r if r < ctx.min_rows else 0
    if pad:  # copies of the last row, outputs too if the real rows have any: the head multiplies a batch
        tok[r : r + pad] = tok[r - 1]
        flags[r : r + pad] = int(n_out > 0)
        meta[1, -1] += pad
    rows = r + pad
    lens = meta[1]
    np.add(b._steps[:rows], meta[0].repeat(lens), out=b.pos[:rows])
    ctx.decode_rows(tok[:rows], b.pos[:rows], meta[2].repeat(lens), flags[:rows])
    for view, *_ in parts:  # (SeqView.took and RecurrentCache._decoded, inline)
        row0, out0, n, outs, start = view._taking
        view._row0, view._out0, view.n_last, view._n_out, view._last_row = row0, out0, n, outs, row0 + n - 1
        view._last_start, view.end, view._rolled = start, start + n, False
    if pad:
        _row0, _out0, n, _outs, start = view._taking
        view._decoded(start, n + pad)
        view.seq_rm(start + n)


def decode_embd_views(ctx, parts: list[tuple[SeqView, list, int, int]]) -> None:
    """Float input rows of several views in one decode (per ``n_batch`` rows): ``(view, arrays, start_pos, n)``,
    the first ``n`` rows of ``arrays`` side by side (as ``Context.decode_embd``) at ``start_pos..`` of the view."""
    ctx.decode_embd_rows([(arrays, start, n, view.seq) for view, arrays, start, n in parts])
    for view, _arrays, start, n in parts:
        if n:
            view._decoded(start, n)
