"""MTP ("nextn") plumbing: the target's last hidden states out, token + hidden-state batches in.

A Qwen3.5/3.6 GGUF carries ``<arch>.nextn_predict_layers`` MTP blocks after its
trunk. Loaded with ``ModelOptions(load_mtp=True)``, the same model serves two
contexts: the target's (trunk only) and an MTP context
(``LLAMA_CONTEXT_TYPE_MTP``) whose graph runs the nextn block on pairs
(token ``x_p``, target hidden state ``h_{p-1}``) and outputs logits for
position ``p + 1`` plus its own hidden state, which feeds the next draft step.

The target context exports ``h_nextn`` (the normed last hidden state) for every
token of a decode (``masked=False``); the MTP context exports it for its
output rows only (``masked=True``). An entry carrying both a token id and an
embedding row is how llama.cpp's batch passes the hidden state to the MTP graph.
"""

from __future__ import annotations

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama.bindings import ext
from localflash.llama.views import float_view
from localflash.llama.runtime import Batch, Context, ContextOptions, Model
from localflash.llama.sequences import SeqView


def enable_nextn(ctx: Context, masked: bool) -> None:
    """Make ``ctx`` export nextn hidden states: every token's (``masked=False``) or the output rows' only."""
    ext().llama_set_embeddings_nextn(ctx.ptr, True, masked)


def nextn_rows(ctx: Context, n_rows: int) -> np.ndarray:
    """Hidden states of the first ``n_rows`` tokens of the last decode (unmasked export): ``[n_rows, n_embd]`` view."""
    if not isinstance(ctx, Context):  # one sequence's view of a shared context: its own rows
        return ctx.nextn_rows(n_rows)
    ptr = ext().llama_get_embeddings_nextn(ctx.ptr)
    if not ptr:
        raise LocalflashError("no nextn hidden states", hint="enable_nextn(ctx) before decoding")
    return float_view(ptr, (n_rows, ctx.model.n_embd))


class MtpContext(Context):
    """A context of type MTP on a model loaded with ``load_mtp``; decodes (token, hidden state) pairs."""

    def __init__(self, model: Model, options: ContextOptions):
        if not getattr(model, "mtp_loaded", False):
            raise LocalflashError(
                f"{model.path.name} was not loaded with its MTP blocks",
                hint="load the target with ModelOptions(load_mtp=True)",
            )
        options.mtp = True
        super().__init__(model, options)
        enable_nextn(self, masked=True)
        self._pair = Batch(self.n_batch, n_seq_max=self.n_seq_max)
        self._hidden = np.zeros((self.n_batch, model.n_embd), dtype=np.float32)

    def decode_pairs(self, tokens, hidden: np.ndarray, start_pos: int, output_last: bool) -> None:
        """Decode ``tokens[i]`` paired with ``hidden[i]`` at ``start_pos + i``; only the last row may be output."""
        n = len(tokens)
        self.decode_pair_rows(tokens, hidden, np.arange(start_pos, start_pos + n, dtype=np.int32), [self.seq] * n,
                              [0] * (n - 1) + [int(output_last)])

    def decode_pair_rows(self, tokens, hidden: np.ndarray, pos, seqs, outputs) -> None:
        """One decode of pairs from several sequences: ``tokens[i]`` with ``hidden[i]`` at ``pos[i]`` in ``seqs[i]``,
        ``outputs[i]`` marking output rows (read by batch index); no rollback bookkeeping (the views keep theirs)."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} pairs exceeds n_batch={self.n_batch}")
        b = self._pair
        b.token[:n] = tokens
        b.pos[:n] = pos
        b.logits[:n] = outputs
        b.set_seqs(seqs)
        self._hidden[:n] = hidden
        b.raw.n_tokens = n
        b.raw.embd = self._hidden.ctypes.data_as(type(b.raw.embd))
        try:
            self._run(b.raw, n)
        finally:
            b.raw.embd = None  # the array is ours: llama_batch_free must not free it
        self._n_out = int(np.count_nonzero(outputs))
        self.n_last = n

    def hidden(self) -> np.ndarray:
        """The MTP block's own hidden state for the output row of the last decode (``n_embd`` view)."""
        ptr = ext().llama_get_embeddings_nextn_ith(self.ptr, -1)
        if not ptr:
            raise LocalflashError("the last MTP decode had no output row")
        return float_view(ptr, (self.model.n_embd,))


class MtpView(SeqView):
    """Sequence ``seq`` of a shared :class:`MtpContext` (a slot's MTP drafter): its pairs, logits and hidden states."""

    def __init__(self, ctx: MtpContext, seq: int):
        super().__init__(ctx, seq)
        self._init_rollback(True)  # the nextn block's plain attention KV, on a hybrid target too: any cut is exact

    def decode_pairs(self, tokens, hidden: np.ndarray, start_pos: int, output_last: bool) -> None:
        decode_pair_views(self.base, [(self, tokens, hidden, start_pos, output_last)])

    def hidden(self) -> np.ndarray:
        """The MTP block's hidden state for this view's last row of the last decode (``n_embd`` view)."""
        ptr = ext().llama_get_embeddings_nextn_ith(self.ptr, self._last_row)
        if not ptr:
            raise LocalflashError("the last MTP decode had no output row for this sequence")
        return float_view(ptr, (self.model.n_embd,))


def decode_pair_views(ctx: MtpContext, parts: list) -> None:
    """One decode of every part's pairs: ``(view, tokens, hidden, start_pos, output_last)``; each view then reads its rows."""
    toks: list[int] = []
    pos: list[int] = []
    seqs: list[int] = []
    flags: list[int] = []
    spans = []
    n_out = 0
    for view, tokens, _hidden, start, out in parts:
        n = len(tokens)
        spans.append((view, len(toks), n_out, n, start, int(out)))
        n_out += int(out)
        toks += list(tokens)
        pos += range(start, start + n)
        seqs += [view.seq] * n
        flags += [0] * (n - 1) + [int(out)]
    ctx.decode_pair_rows(toks, np.concatenate([h for _v, _t, h, _s, _o in parts]), np.asarray(pos, np.int32), seqs, flags)
    for view, row0, out0, n, start, outs in spans:
        view._decoded(start, n)
        view.took(row0, out0, n, outs)
