"""A reusable ``llama_batch``: token or embedding rows, positions, output flags and sequence ids."""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from localflash.llama.bindings import lib


class Batch:
    """A reusable ``llama_batch`` with NumPy views onto its arrays.

    Every row starts in sequence 0 with one sequence id; :meth:`set_seqs` puts rows in other
    sequences, or one row in several (up to ``n_seq_max``: a token shared by tree branches).
    """

    def __init__(self, capacity: int, embd_width: int = 0, n_seq_max: int = 1):
        L = lib()
        self.capacity = capacity
        self.width = embd_width
        self.n_seq_max = n_seq_max
        self.raw = L.llama_batch_init(capacity, embd_width, n_seq_max)
        # every row's sequence ids in one [capacity, n_seq_max] array of ours (the rows point into it, the
        # pointers llama_batch_init made are put back before llama_batch_free): rows are set by array operations
        self.seq_ids = np.zeros((capacity, n_seq_max), np.int32)
        own = (ctypes.POINTER(ctypes.c_int32) * capacity)(*[self.raw.seq_id[i] for i in range(capacity)])
        base, step = self.seq_ids.ctypes.data, 4 * n_seq_max
        for i in range(capacity):
            self.raw.seq_id[i] = ctypes.cast(base + i * step, ctypes.POINTER(ctypes.c_int32))
        self.close = weakref.finalize(self, _free, L.llama_batch_free, self.raw, own, self.seq_ids)
        if embd_width:
            self.embd = np.ctypeslib.as_array(self.raw.embd, shape=(capacity, embd_width))
            self.embd_taps: np.ndarray | None = None  # embd seen as [capacity, taps, width] (EmbdRows, made on first use)
        else:
            self.token = np.ctypeslib.as_array(self.raw.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(self.raw.pos, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(self.raw.logits, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(self.raw.n_seq_id, shape=(capacity,))
        self.n_seq_id[:] = 1
        self._seq = np.zeros(capacity, np.int64)  # each row's (first) sequence id as set, to skip unchanged rows
        self._multi = False  # some row lists more than one sequence
        self._uniform: int | None = 0  # every row is in this one sequence (as made), until set_seqs says otherwise
        self._steps = np.arange(capacity, dtype=np.int32)
        # ctypes views of the same arrays: a few rows are cheaper to fill through them than through NumPy
        if not embd_width:
            self._c_token = (ctypes.c_int32 * capacity).from_address(ctypes.addressof(self.raw.token.contents))
        self._c_pos = (ctypes.c_int32 * capacity).from_address(ctypes.addressof(self.raw.pos.contents))
        self._c_flags = ctypes.addressof(self.raw.logits.contents)
        self.flags_set: tuple | None = None  # (outputs, n) as :meth:`fill` last wrote the flags; None: written otherwise since

    def fill(self, tokens, start: int, outputs: str) -> int:
        """Rows ``0..n-1``: ``tokens`` at positions ``start..``, outputs ``all``, ``last`` or ``none``;
        returns the number of output rows. One cycle's verify batch: a few slice copies, no arrays made."""
        n = len(tokens)
        self._c_token[0:n] = tokens
        self._c_pos[0:n] = range(start, start + n)
        if self.flags_set != (outputs, n):  # a loop's decodes repeat their flags: written only when they change
            ctypes.memset(self._c_flags, outputs == "all", n)
            if outputs == "last":
                self.logits[n - 1] = 1
            self.flags_set = (outputs, n)
        return n if outputs == "all" else int(outputs == "last")

    def set_positions(self, start: int, n: int) -> None:
        """Rows ``0..n-1`` at positions ``start..start+n-1`` (in place: no array is made)."""
        np.add(self._steps[:n], start, out=self.pos[:n])

    def set_seqs(self, seqs, start: int = 0) -> None:
        """Row ``start + i`` belongs to sequence ``seqs[i]`` (an int) or to every id of ``seqs[i]`` (a list)."""
        if self._multi:
            self.n_seq_id[:] = 1
            self._multi = False
        self._uniform = None
        try:
            ids = np.asarray(seqs)
        except ValueError:  # rows listing different numbers of sequences (a tree's)
            ids = None
        if ids is not None and ids.ndim == 1 and ids.dtype.kind in "iu":  # one sequence a row
            self.seq_ids[start : start + len(ids), 0] = ids
            self._seq[start : start + len(ids)] = ids
            return
        for i, s in enumerate(seqs, start):
            if isinstance(s, (list, tuple)):
                if not 1 <= len(s) <= self.n_seq_max:
                    raise ValueError(f"row {i} lists {len(s)} sequences; the batch was made for 1..{self.n_seq_max}")
                self.seq_ids[i, : len(s)] = s
                self.n_seq_id[i] = len(s)
                self._seq[i] = -1
                self._multi = self._multi or len(s) > 1
            else:
                self.seq_ids[i, 0] = s
                self._seq[i] = s

    def set_seq_spans(self, first: np.ndarray, count: np.ndarray) -> None:
        """Row ``i`` belongs to sequences ``first[i] .. first[i] + count[i] - 1`` (a tree's rows: the leaves below each
        node, consecutive ids): array operations only, no Python call per row."""
        n = len(first)
        width = int(count.max()) if n else 1
        if n and (width > self.n_seq_max or count.min() < 1):
            raise ValueError(f"rows list {int(count.min())}..{width} sequences; the batch was made for 1..{self.n_seq_max}")
        if self._multi:
            self.n_seq_id[:] = 1
        np.add(first[:, None], self._steps[:width], out=self.seq_ids[:n, :width])
        self.n_seq_id[:n] = count
        np.copyto(self._seq[:n], np.where(count == 1, first, -1))
        self._multi = width > 1
        self._uniform = None

    def set_seq_range(self, seq: int, start: int, n: int) -> None:
        """Rows ``start..start+n-1`` in sequence ``seq`` alone: only rows now in another sequence are written
        (a one-stream batch's rows are all in place already: no per-row Python)."""
        if self._uniform == seq:
            return
        if self._multi:
            self.n_seq_id[:] = 1
            self._multi = False  # (rows that listed sequences hold -1 in _seq: rewritten below)
        self.seq_ids[start : start + n, 0] = seq
        self._seq[start : start + n] = seq
        self._uniform = None

    def reset_seqs(self, n: int) -> None:
        """Rows ``0..n-1`` back in sequence 0 (what one-sequence decodes expect)."""
        if self._multi or self._seq[:n].any():
            self.set_seqs([0] * n)


def _free(batch_free, raw, own, seq_ids) -> None:
    """``llama_batch_free``, the rows' own sequence-id arrays put back first (``seq_ids``: kept alive until then)."""
    for i in range(len(own)):
        raw.seq_id[i] = own[i]
    batch_free(raw)
