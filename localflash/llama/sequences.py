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

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama.bindings import ext, lib, lib_address
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

    def logits(self, row: int = -1) -> np.ndarray:
        """Logits of this view's output row ``row`` (-1: its last row) of the last decode."""
        i = self._last_row if row == -1 else self._row0 + row
        address = lib_address("llama_get_logits_ith")(self.ptr, i)
        if not address:
            raise LocalflashError("no logits for that row")
        return address_view(address, (self.model.n_vocab,))

    def all_logits(self) -> np.ndarray:
        full = lib_address("llama_get_logits")(self.ptr)
        return address_view(full, (self._out0 + self._n_out, self.model.n_vocab))[self._out0 :]

    def layer_input(self, lid: int, n_rows: int) -> np.ndarray:
        return self.base.layer_inputs((lid,), self._row0 + n_rows)[0][self._row0 :]

    def layer_inputs(self, layer_ids, n_rows: int) -> list[np.ndarray]:
        """:meth:`layer_input` of each of ``layer_ids`` (what a DFlash drafter injects per cycle): the base
        context's cached views of the whole batch, sliced to this view's rows."""
        r0 = self._row0
        return [v[r0:] for v in self.base.layer_inputs(layer_ids, r0 + n_rows)]

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

    def close(self) -> None:
        """The shared context outlives its views (its owner closes it)."""


def decode_views(ctx, parts: list[tuple[SeqView, list[int], int, bool | str]]) -> None:
    """One decode carrying every part's rows: ``(view, tokens, start_pos, outputs)``.

    ``outputs``: ``"all"`` (or True), ``"last"`` (or False: its last row) or ``"none"``. Afterwards each
    view reads its own rows (:meth:`SeqView.took`). With exact numerics (``min_rows`` 2) a batch of one
    row is padded as a lone decode would be, and the padding cut off again.
    """
    toks: list[int] = []
    pos: list[int] = []
    seqs: list[int] = []
    flags: list[int] = []
    spans = []
    n_out = 0
    for view, tokens, start, outputs in parts:
        n = len(tokens)
        outputs = {True: "all", False: "last"}.get(outputs, outputs)
        outs = n if outputs == "all" else int(outputs == "last")
        spans.append((view, len(toks), n_out, n, outs, start))
        toks += tokens
        pos += range(start, start + n)
        seqs += [view.seq] * n
        flags += [1] * n if outputs == "all" else [0] * (n - outs) + [1] * outs
        n_out += outs
    pad = ctx.min_rows - len(toks) if len(toks) < ctx.min_rows else 0
    if pad:
        view, start = parts[-1][0], pos[-1] + 1
        toks += [toks[-1]] * pad
        pos += range(start, start + pad)
        seqs += [view.seq] * pad
        flags += [int(n_out > 0)] * pad  # outputs too if the real rows have any: the head multiplies a batch
    ctx.decode_rows(toks, np.asarray(pos, np.int32), seqs, flags)
    for view, row0, out0, n, outs, start in spans:
        view._decoded(start, n)
        view.took(row0, out0, n, outs)
    if pad:
        view = parts[-1][0]
        view._decoded(spans[-1][5], spans[-1][3] + pad)
        view.seq_rm(spans[-1][5] + spans[-1][3])


def decode_embd_views(ctx, parts: list[tuple[SeqView, list, int, int]]) -> None:
    """Float input rows of several views in one decode (per ``n_batch`` rows): ``(view, arrays, start_pos, n)``,
    the first ``n`` rows of ``arrays`` side by side (as ``Context.decode_embd``) at ``start_pos..`` of the view."""
    ctx.decode_embd_rows([(arrays, start, n, view.seq) for view, arrays, start, n in parts])
    for view, _arrays, start, n in parts:
        if n:
            view._decoded(start, n)
