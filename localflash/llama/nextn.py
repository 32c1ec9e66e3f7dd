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
        self._pair = Batch(self.n_batch)
        self._hidden = np.zeros((self.n_batch, model.n_embd), dtype=np.float32)

    def decode_pairs(self, tokens, hidden: np.ndarray, start_pos: int, output_last: bool) -> None:
        """Decode ``tokens[i]`` paired with ``hidden[i]`` at ``start_pos + i``; only the last row may be output."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} pairs exceeds n_batch={self.n_batch}")
        b = self._pair
        b.token[:n] = tokens
        b.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        b.logits[:n] = 0
        if output_last:
            b.logits[n - 1] = 1
        self._hidden[:n] = hidden
        b.raw.n_tokens = n
        b.raw.embd = self._hidden.ctypes.data_as(type(b.raw.embd))
        try:
            self._run(b.raw, n)
        finally:
            b.raw.embd = None  # the array is ours: llama_batch_free must not free it
        self._n_out = int(output_last)
        self.n_last = n

    def hidden(self) -> np.ndarray:
        """The MTP block's own hidden state for the output row of the last decode (``n_embd`` view)."""
        ptr = ext().llama_get_embeddings_nextn_ith(self.ptr, -1)
        if not ptr:
            raise LocalflashError("the last MTP decode had no output row")
        return float_view(ptr, (self.model.n_embd,))
