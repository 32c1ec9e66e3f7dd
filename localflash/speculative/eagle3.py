"""EAGLE-3: a one-layer drafter that reads three tapped target layers and drafts autoregressively.

The file (arch ``eagle3``, ``src/models/eagle3.cpp``) has an *encoder* — ``fc``
over the concatenated inputs of the target layers ``eagle3.target_layers`` —
and a *decoder* layer whose input at position P is the pair
``(token[P+1], g[P])``: the next token's embedding beside the encoder output
``g`` of position P. So the pair at P can only be written once the token after
P is known; the last committed position's ``g`` waits ("pending") until the
next token arrives:

- after every target decode, the rows' features are encoded into ``g`` rows
  and the pairs whose next token is in the batch are written into the
  drafter's KV (like llama.cpp's driver, every row of a verify batch is
  written and the ones past the committed text are dropped again);
- a draft first writes the pending pair with the target's newest token (its
  output predicts the token after that), then feeds each drafted token with
  the decoder's own pre-norm hidden state as the next ``g``, one step per token.

Reduced-vocabulary drafters carry ``d2t``; llama.cpp's graph scatters their
logits back to target ids, so drafts are target ids already. Files without
their own token embedding or head borrow the target's through ``ctx_other``.
The ``p_min`` cut-off reads the softmax over the ten best logits, as
llama.cpp's EAGLE-3 driver does (its draft sampler is top-k 10).
"""

from __future__ import annotations

import numpy as np

from localflash.archs import EAGLE3_ENCODE_ROWS, LAYER_INPUT_ARCHS
from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import read_meta
from localflash.llama import Context, ContextOptions, Model
from localflash.llama.ext_batch import ExtBatch
from localflash.speculative.drafter import Drafter
from localflash.speculative.tree import Tree, chain_with_siblings, top_candidates

P_MIN_TOP_K = 10


def check_eagle3_pair(target: Model, drafter: Model) -> list[int]:
    """Validate an EAGLE-3 drafter against its target; return the three layer ids to tap."""
    if drafter.arch != "eagle3":
        hint = "use --spec dflash for a DFlash drafter" if drafter.arch == "dflash" else None
        raise LocalflashError(f"{drafter.path.name} is a {drafter.arch!r} model, not an EAGLE-3 drafter", hint=hint)
    if target.arch not in LAYER_INPUT_ARCHS:
        raise LocalflashError(
            f"target arch {target.arch!r} cannot export layer inputs, which EAGLE-3 needs",
            hint="use --spec draft with a small model of the same family, or --spec ngram",
        )
    ids = drafter.target_layer_ids()
    if len(ids) != 3:
        raise LocalflashError(f"{drafter.path.name} taps {len(ids)} target layers; EAGLE-3 fuses exactly 3 (eagle3.target_layers)")
    if min(ids) < 0 or max(ids) >= target.n_layer:
        raise LocalflashError(
            f"EAGLE-3 drafter taps target layers {ids} but {target.path.name} has layers 0..{target.n_layer - 1}",
            hint="this drafter was made for a different (deeper) target",
        )
    hidden = int(drafter.meta("eagle3.target_hidden_size") or 0)
    if hidden != target.n_embd:
        raise LocalflashError(
            f"EAGLE-3 drafter expects target_hidden_size {hidden} but {target.path.name} is {target.n_embd} wide",
            hint="this drafter was made for a target of another width",
        )
    if drafter.n_vocab != target.n_vocab:
        raise LocalflashError(f"drafter vocabulary ({drafter.n_vocab}) differs from the target's ({target.n_vocab})")
    return ids


def needs_target_weights(path) -> bool:
    """True when the file lacks its own token embedding or head (it then borrows the target's)."""
    names = {t.name for t in read_meta(path).tensors}
    return "token_embd.weight" not in names or "output.weight" not in names


class Eagle3Drafter(Drafter):
    name = "eagle3"
    cost_grows_with_length = True  # one decoder step per drafted token

    def __init__(self, model: Model, target: Model, target_ctx: Context, n_ctx: int, max_draft: int = 8, p_min: float = 0.0, n_threads: int = 0,
                 kv: str = "f16"):
        self.layer_ids = check_eagle3_pair(target, model)
        self.model = model
        self.max_draft = max_draft
        self.p_min = p_min
        other = target_ctx if needs_target_weights(model.path) else None
        self.ctx = Context(
            model,
            ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_outputs_max=512, n_threads=n_threads, type_k=kv, type_v=kv),
            other=other,
        )
        self.ctx.output_nextn(masked=True)  # the pre-norm hidden state of each output row: the next step's g
        self.batch = ExtBatch(self.ctx)
        target_ctx.capture_layer_inputs(self.layer_ids)
        self.n_written = 0  # decoder pairs in the drafter's KV: positions 0..n_written-1
        self.pending: np.ndarray | None = None  # g of position n_written, waiting for the token after it
        self.ctx_limit = self.ctx.n_ctx - max_draft - 1

    @property
    def n_fed(self) -> int:
        """Positions whose target features the drafter has seen."""
        return self.n_written + (self.pending is not None)

    def rollback(self, n_keep: int) -> None:
        if self.n_fed <= n_keep:
            return
        # the g of position n_keep-1 is gone with the rows that made it; that one pair is written
        # from the next row's g instead (a draft-quality approximation only: drafts are verified)
        keep = max(n_keep - 1, 0)
        self.ctx.seq_rm(keep)
        self.n_written = keep
        self.pending = None

    def _encode(self, feats: np.ndarray) -> np.ndarray:
        out = np.empty((feats.shape[0], self.model.n_embd), np.float32)
        # llama.cpp sizes an encoder pass's output buffer (logits included) by its rows: keep passes short
        for off in range(0, feats.shape[0], EAGLE3_ENCODE_ROWS):
            chunk = feats[off : off + EAGLE3_ENCODE_ROWS]
            self.batch.encode(chunk, self.ctx.pos_max() + 1)
            out[off : off + len(chunk)] = self.ctx.nextn_rows(len(chunk))
        return out

    def on_target_decode(self, target_ctx: Context, start_pos: int, n_committed: int) -> None:
        fill_gap = self.pending is None and self.n_written == start_pos - 1 and start_pos > 0  # after a rollback
        if (start_pos != self.n_fed and not fill_gap) or start_pos + n_committed > self.ctx_limit:
            return  # past the drafter's context (or after a gap): no features, so no drafts from here
        rows = target_ctx.n_last
        tokens = target_ctx.last_tokens()[:rows].tolist()
        feats = np.concatenate([target_ctx.layer_input(lid, rows) for lid in self.layer_ids], axis=1)
        g = self._encode(feats)
        pair_tok, pair_g, pair_pos = tokens[1:], list(g[:-1]), list(range(start_pos, start_pos + rows - 1))
        if self.n_written == start_pos - 1:  # the pending (or lost) pair before this batch: its token is tokens[0]
            bridge = self.pending if self.pending is not None else g[0]
            pair_tok, pair_g, pair_pos = [tokens[0]] + pair_tok, [bridge] + pair_g, [start_pos - 1] + pair_pos
        for off in range(0, len(pair_tok), self.ctx.n_batch):
            sl = slice(off, off + self.ctx.n_batch)
            n = len(pair_tok[sl])
            self.batch.decode(pair_tok[sl], np.stack(pair_g[sl]), pair_pos[sl], [False] * n)
        end = start_pos + n_committed - 1  # the last committed position: its pair waits for the next token
        if self.ctx.pos_max() >= end:
            self.ctx.seq_rm(end)
        self.n_written = end
        self.pending = g[n_committed - 1].copy()

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        return self._draft(history, n_past, k)

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int) -> Tree:
        """The greedy chain plus each step's next-best tokens as side leaves (best-first by cumulative probability)."""
        steps: list = []
        chain = self._draft(history, n_past, min(k, budget), steps)
        return chain_with_siblings(history[-1], chain, steps, budget)

    def _draft(self, history: list[int], n_past: int, k: int, steps: list | None = None) -> list[int]:
        """Greedy drafts; with ``steps``, each step's top candidates and log-probabilities are appended to it."""
        k = min(k, self.max_draft)
        if k <= 0 or self.pending is None or self.n_written != n_past - 1:
            return []
        pos = n_past - 1
        self.batch.decode([history[-1]], self.pending[None, :], [pos], [True])
        self.n_written, self.pending = n_past, None  # the pending pair is written now, with the right token
        drafts: list[int] = []
        while True:
            logits = self.ctx.logits(0)
            tok = int(np.argmax(logits))
            if self.p_min > 0.0:
                top = np.partition(logits, -P_MIN_TOP_K)[-P_MIN_TOP_K:]
                if 1.0 / float(np.exp(top - logits[tok]).sum()) < self.p_min:
                    break
            drafts.append(tok)
            if steps is not None:
                steps.append(top_candidates(logits))
            if len(drafts) == k:
                break
            pos += 1
            self.batch.decode([tok], self.ctx.nextn_rows(1).copy(), [pos], [True])
        self.ctx.seq_rm(n_past)  # drop the draft chain; the pairs up to n_past-1 are the committed text's
        return drafts

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()
