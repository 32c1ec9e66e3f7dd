"""``llama_batch_ext`` + ``llama_process``: batches whose entries carry a token, an embedding row, or both.

The classic ``llama_batch`` holds either token ids or embeddings. EAGLE-3's
decoder needs each entry to have both (the token and the drafter's own
hidden state ``g``), and its encoder runs as an ``ENCODE`` pass over rows of
fused target features; llama.cpp's extended batch API does both. The batch
copies the rows it is given, so NumPy arrays may be reused afterwards.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama.bindings import lib
from localflash.llama.runtime import Context, _last_error


class ExtBatch:
    """One reusable extended batch for ``ctx`` (sequence 0)."""

    def __init__(self, ctx: Context):
        L = lib()
        self.ctx = ctx
        self.ptr = L.llama_batch_ext_init(ctx.ptr)
        if not self.ptr:
            raise LocalflashError(f"llama.cpp could not make an extended batch for {ctx.model.path.name}")
        self._free = weakref.finalize(self, L.llama_batch_ext_free, self.ptr)
        self._pos = (ctypes.c_int32 * 4)()

    def _embd(self, row: np.ndarray):
        L = lib()
        e = L.llama_embd()
        e.data = row.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        e.n_rows = 1
        e.n_embd = row.shape[0]
        return e

    def _set_pos(self, idx: int, pos: int) -> None:
        self._pos[0] = self._pos[1] = self._pos[2] = pos
        self._pos[3] = 0
        lib().llama_batch_ext_set_pos(self.ptr, idx, self._pos)

    def encode(self, rows: np.ndarray, start_pos: int) -> None:
        """An ``ENCODE`` pass over float rows (e.g. EAGLE-3 fused features); read the result as nextn rows."""
        L = lib()
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        L.llama_batch_ext_clear(self.ptr)
        for i in range(rows.shape[0]):
            idx = L.llama_batch_ext_add_embd(self.ptr, 0, self._embd(rows[i]))
            if idx < 0:
                raise LocalflashError(f"could not add encoder row {i} (code {idx})")
            self._set_pos(idx, start_pos + i)
            L.llama_batch_ext_set_output_embd(self.ptr, idx, True)
        self._process(L.LLAMA_PROCESS_TYPE_ENCODE, rows.shape[0])

    def decode(self, tokens: list[int], rows: np.ndarray, positions: list[int], outputs: list[bool]) -> None:
        """A ``DECODE`` pass over entries that each carry a token id and an embedding row."""
        L = lib()
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        L.llama_batch_ext_clear(self.ptr)
        for i, (tok, pos, out) in enumerate(zip(tokens, positions, outputs)):
            idx = L.llama_batch_ext_add_token(self.ptr, 0, int(tok))
            if idx < 0:
                raise LocalflashError(f"could not add token {tok} to the batch (code {idx})")
            self._set_pos(idx, int(pos))
            if not L.llama_batch_ext_set_embd_token(self.ptr, idx, self._embd(rows[i])):
                raise LocalflashError(f"the embedding row of entry {i} does not fit {self.ctx.model.path.name}")
            if out:
                L.llama_batch_ext_set_output_logits(self.ptr, idx, True)
        self._process(L.LLAMA_PROCESS_TYPE_DECODE, len(tokens))

    def _process(self, kind: int, n: int) -> None:
        rc = lib().llama_process(self.ctx.ptr, kind, self.ptr)
        if rc != 0:
            if rc == 1:
                raise LocalflashError(f"{self.ctx.model.path.name}: the drafter's context is full ({self.ctx.n_ctx} tokens)")
            raise LocalflashError(f"llama_process failed with code {rc} on a batch of {n}: {_last_error()}")

    def close(self) -> None:
        self._free()
