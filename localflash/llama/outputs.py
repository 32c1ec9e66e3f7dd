"""Where a decode's outputs lie in llama.cpp's output buffer: one ctypes call a decode finds every one a cycle reads.

llama.cpp keeps a decode's outputs in one host buffer, laid out for that decode's output count
``n`` (at least ``n_seq_max``; ``llama_context::output_reserve`` in src/llama-context.cpp): logits
``[n, n_vocab]``, nextn rows (``[n or n_batch, n_embd]``, when asked for), every captured layer's
inputs ``[n_batch, n_embd]`` in layer order, then, with in-graph samplers, their logits and probs
``[n, n_vocab]`` each and the sampled ids ``[n]`` (int32, by output row). ``llama_get_logits``
returns the buffer's start (after putting the rows back in batch order). So one call after a decode
gives every address the loop reads of it: the ids the graph drew for all its rows (a DFlash block's
drafts, a verify pass's target tokens) and each tapped layer's inputs, where it took one call per
row and one per layer. A layout (start, output count, taps) is checked once against llama.cpp's own
getters (``llama_get_embeddings_layer_inp``'s addresses, ``llama_get_sampled_token_ith``'s ids); one
that does not match (another llama.cpp, an embedding context) is read through those getters always.
"""

from __future__ import annotations

import ctypes

from localflash.llama.bindings import ext_address, lib, lib_address
from localflash.llama.views import layers_view

LLAMA_TOKEN_NULL = -1


class OutputBuffer:
    """:class:`~localflash.llama.runtime.Context` methods: the last decode's outputs found from one call."""

    def _init_outputs(self) -> None:
        self._out_start = 0  # the output buffer's start as of the last decode (0: not asked since)
        self._outs: tuple | None = None  # the last decode's (output rows, every row an output); None: not known
        self._outs_next: tuple | None = None  # set by the decode about to run (_run moves it to _outs)
        self._out_graph = False  # the last decode ran with a chain attached (its buffer then holds sampled ids)
        self._taps: list[int] = []  # captured layer ids, ascending (their inputs lie in this order)
        self._nextn = 0  # nextn rows: 0 none, 1 output rows only (masked), 2 every row
        self._out_kind = (0, 0)  # (len(_taps), _nextn): the part of a layout key that changes only with them
        self._layouts: dict = {}  # layout key -> checked views (or False: read through the getters)
        self._get_start = lib_address("llama_get_logits")

    def _floats_before(self, n_alloc: int) -> tuple[int, int]:
        """(floats before the first captured layer's inputs, floats before the sampled ids) for ``n_alloc`` output rows."""
        n_vocab, n_embd, n_batch = self.model.n_vocab, self.model.n_embd, self.n_batch
        nextn = 0 if not self._nextn else n_embd * (n_alloc if self._nextn == 1 else n_batch)
        taps = n_alloc * n_vocab + nextn
        return taps, taps + len(self._taps) * n_embd * n_batch + 2 * n_alloc * n_vocab

    def _sampled_view(self):
        """The in-graph chain's ids of the last decode's output rows (a ctypes int32 array by output row: slicing it
        gives a list), or None where the layout is not known to hold them (read row by row then)."""
        outs = self._outs
        if outs is None or not self._out_graph or not self._chains:
            return None
        start = self._out_start
        if not start:  # (inline: a helper would be one more Python call a read)
            start = self._out_start = self._get_start(self.ptr) or 0
        key = (start, outs[0], self._out_kind)
        try:
            v = self._layouts[key]
        except KeyError:
            v = self._check_sampled(key, outs)
            if v is None:
                return None
        return v if v is not False else None

    def _check_sampled(self, key, outs):
        start, n_out = key[0], outs[0]
        if not start or n_out <= 0:
            return None
        n_alloc = max(n_out, self.n_seq_max)
        address = start + 4 * self._floats_before(n_alloc)[1]
        view = (ctypes.c_int32 * n_out).from_address(address)  # a slice of it is a list: no NumPy call a read
        get = lib().llama_get_sampled_token_ith
        rows = range(n_out) if outs[1] else [-1]
        want = [get(self.ptr, i) for i in rows]
        have = view[:] if outs[1] else [view[-1]]
        if all(t == LLAMA_TOKEN_NULL for t in want):
            return None  # nothing sampled to compare by: not decided yet
        ok = view if want == have else False
        self._remember(key, ok)
        return ok

    def _layer_addresses(self, layer_ids) -> tuple | None:
        """The addresses of ``layer_ids``' inputs from the output buffer's start alone (checked once a layout), or None
        where the layout is not the known one (:meth:`layer_inputs` then asks llama.cpp for each)."""
        outs = self._outs
        if outs is None:
            return None
        start = self._out_start
        if not start:
            start = self._out_start = self._get_start(self.ptr) or 0
        key = (start, outs[0], tuple(layer_ids), self._out_kind)
        try:
            v = self._layouts[key]
        except KeyError:
            v = self._check_layers(key, layer_ids)
        return v if v is not False else None

    def layer_input_rows(self, layer_ids, n_rows: int):
        """:meth:`layer_inputs` side by side: a ``[n_rows, taps, n_embd]`` view (views.layers_view; cached with the per-layer views), or where
        llama.cpp lays the layers out otherwise, the list :meth:`layer_inputs` gives."""
        addresses = self._layer_addresses(layer_ids)
        out = self._tap_views.get((addresses, n_rows, 3)) if addresses is not None else None
        if out is None:
            # a row count not seen yet: a slice of the view of every row the buffer holds (n_batch), made once
            full = self._tap_views.get((addresses, 0, 3)) if addresses is not None else None
            if full is None:
                full = layers_view(addresses, self.n_batch, self.model.n_embd) if addresses is not None else None
                if full is None:
                    return self.layer_inputs(layer_ids, n_rows)
                self._tap_views[(addresses, 0, 3)] = full
            out = self._tap_views[(addresses, n_rows, 3)] = full[:n_rows]
        return out

    def _check_layers(self, key, layer_ids):
        start, n_out = key[0], key[1]
        if not start or not set(layer_ids) <= set(self._taps):
            return False
        n_embd = self.model.n_embd
        first = self._floats_before(max(n_out, self.n_seq_max))[0]
        addresses = tuple([start + 4 * (first + self._taps.index(lid) * n_embd * self.n_batch) for lid in layer_ids])
        get = ext_address("llama_get_embeddings_layer_inp")
        ok = addresses if list(addresses) == [get(self.ptr, lid) for lid in layer_ids] else False
        self._remember(key, ok)
        return ok

    def _remember(self, key, value) -> None:
        if len(self._layouts) >= 256:
            self._layouts.clear()
        self._layouts[key] = value
