"""Float input rows (DFlash target features, EAGLE-3 hidden states) decoded straight from NumPy arrays.

A mixin of :class:`localflash.llama.runtime.Context`: the rows are written into a float
batch of the context's own (``_embd_batch``, made on first use and when the width changes),
one ``llama_decode`` per ``n_batch`` rows, several sequences' rows in one decode.
"""

from __future__ import annotations

import numpy as np

from localflash.llama.batch import Batch


class EmbdRows:
    def decode_embd(self, parts, start_pos: int, n: int | None = None) -> None:
        """Decode float input rows (e.g. DFlash target features), no outputs: ``parts`` is one ``[n, width]``
        array, a ``[n, taps, w]`` array (``Context.layer_input_rows``: each row's taps side by side) or a list
        of ``[>= n, w_i]`` arrays whose first ``n`` rows, side by side, are the rows (written straight into the
        batch: no joined copy)."""
        if type(parts) is np.ndarray and parts.ndim == 3:
            rows = parts.shape[0]
        else:
            parts = [parts] if isinstance(parts, np.ndarray) else list(parts)
            rows = parts[0].shape[0]
        n = rows if n is None else n
        self.decode_embd_rows([(parts, start_pos, n, self.seq)])
        last = (n - 1) // self.n_batch * self.n_batch  # the last decode's first row
        self._last_start, self.end, self._rolled = start_pos + last, start_pos + n, False  # (RecurrentCache._decoded)

    def decode_embd_rows(self, items) -> None:
        """Float input rows of several sequences, no outputs: ``items`` of ``(parts, start_pos, n, seq)`` as :meth:`decode_embd`'s,
        in one decode per ``n_batch`` rows (every slot's features at once); the caller (a view per sequence) keeps rollback state.
        A ``[n, taps, w]`` part goes into the batch in one copy (a cycle's committed rows: hundreds of KB at width 5,120)."""
        if not (items := [it for it in items if it[2] > 0]):
            return
        first = items[0][0]
        if type(first) is np.ndarray:  # [n, taps, w]
            width = first.shape[1] * first.shape[2]
        else:
            width = 0
            for p in first:
                width += p.shape[1]
        b = self._embd_batch
        if b is None or b.width != width:
            if b is not None:
                b.close()
            b = self._embd_batch = Batch(self.n_batch, width, n_seq_max=self.n_seq_max)
            b.logits[:] = 0  # no row of it is ever an output
        row, last, cap = 0, items[-1], self.n_batch
        for item in items:
            parts, start_pos, n, seq = item
            off = 0
            while off < n:
                m = n - off if n - off < cap - row else cap - row
                if type(parts) is np.ndarray:  # one copy; the batch seen as [rows, taps, w] (a view made once)
                    rows = b.embd_taps
                    if rows is None or rows.shape[1] != parts.shape[1]:
                        rows = b.embd_taps = b.embd.reshape(cap, parts.shape[1], parts.shape[2])
                    rows[row : row + m] = parts[off : off + m]
                elif len(parts) > 1:  # the parts side by side in one call (one numpy call per part costs more)
                    np.concatenate([p[off : off + m] for p in parts], axis=1, out=b.embd[row : row + m])
                else:
                    b.embd[row : row + m] = parts[0][off : off + m]
                b._c_pos[row : row + m] = range(start_pos + off, start_pos + off + m)  # (a NumPy ufunc costs more, cold)
                b.set_seq_range(seq, row, m)  # rows already in ``seq`` cost nothing (one stream: every cycle)
                row, off = row + m, off + m
                if row == cap or (off == n and item is last):
                    b.raw.n_tokens = row
                    self._outs_next = (0, False)
                    self._run(b.raw, row)
                    row = 0
        self._n_out = 0
