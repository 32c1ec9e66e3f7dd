"""MTP: the target's own multi-token-prediction ("nextn") block as drafter.

Qwen3.5/3.6 GGUFs ship one MTP block after the trunk. The target model is
loaded once with its MTP weights; a second context of type MTP on the same
model runs only that block. The block at position ``p`` reads the token
``x_p`` and the target's hidden state ``h_{p-1}`` (the normed output of the
trunk at the previous position) and predicts ``x_{p+1}``; drafting feeds its
own hidden state back for the next step, one MTP decode per drafted token.

Cache discipline (the MTP context holds plain attention KV for the nextn block,
so any cut is exact): after every target decode the committed tokens are
decoded into the MTP cache paired with the target's hidden states shifted by
one (``h`` of the previous committed token first); the draft steps of a
proposal are cut off again before the target verifies them. The MTP cache
thus always holds positions ``0..n_fed-1`` of the committed text, as in
llama.cpp's ``common_speculative_impl_draft_mtp``.
"""

from __future__ import annotations

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model
from localflash.llama.nextn import MtpContext, enable_nextn, nextn_rows
from localflash.speculative.drafter import Drafter

HIDDEN_KEPT = 64  # hidden states of the last positions kept, so a short rollback pairs exactly again
PROMPT_ENDS_KEPT = 8  # ... and those at the end of the last few prompts, where a chat's next turn resumes


def check_mtp_target(target: Model) -> None:
    """Raise unless ``target`` carries MTP (nextn) layers and was loaded with them."""
    if target.n_layer_nextn <= 0:
        raise LocalflashError(
            f"{target.path.name} has no MTP (nextn) layers, so --spec mtp cannot draft with it",
            hint="Qwen3.5/3.6 GGUFs converted with their MTP block have them; otherwise use --spec ngram, draft or dflash",
        )
    if not target.mtp_loaded:
        raise LocalflashError(f"{target.path.name} was loaded without its MTP block", hint="load it with load_mtp")


class MtpDrafter(Drafter):
    """Greedy drafts from the target's MTP block, with a ``p_min`` confidence cut-off."""

    name = "mtp"

    def __init__(self, target: Model, target_ctx: Context, n_ctx: int, max_draft: int = 3, p_min: float = 0.0,
                 n_threads: int = 0, kv: str = "f16"):
        check_mtp_target(target)
        self.max_draft = max_draft
        self.p_min = p_min
        enable_nextn(target_ctx, masked=False)
        self.ctx = MtpContext(target, ContextOptions(
            n_ctx=n_ctx, n_batch=target_ctx.n_batch, n_ubatch=min(512, target_ctx.n_batch), n_outputs_max=1,
            n_threads=n_threads, type_k=kv, type_v=kv))
        self.ctx_limit = self.ctx.n_ctx
        width = target.n_embd
        self.n_fed = 0  # the MTP cache holds positions 0..n_fed-1
        self._kept = np.zeros((HIDDEN_KEPT, width), np.float32)  # h_p at row p % HIDDEN_KEPT
        self._kept_pos = np.full(HIDDEN_KEPT, -1, np.int64)
        self._zero = np.zeros(width, np.float32)
        self._pinned: dict[int, np.ndarray] = {}  # position -> h, at recent prompts' ends
        self.unpaired = 0  # feeds whose first token had no known h_{p-1} (paired with zeros)

    def _hidden_at(self, pos: int) -> np.ndarray | None:
        if pos < 0:
            return self._zero  # the first token of the text: llama.cpp pairs it with zeros too
        slot = pos % HIDDEN_KEPT
        return self._kept[slot] if self._kept_pos[slot] == pos else self._pinned.get(pos)

    def on_prompt(self, prompt: list[int]) -> None:
        """Keep h at the prompt's last positions: a later prompt that continues this one may resume there
        (a hybrid target restores its state checkpoint from before the prompt's last token)."""
        for pos in (len(prompt) - 2, len(prompt) - 1):
            h = self._hidden_at(pos)
            if pos >= 0 and h is not None:
                self._pinned[pos] = h.copy()
        for pos in sorted(self._pinned)[:-2 * PROMPT_ENDS_KEPT]:
            del self._pinned[pos]

    def rollback(self, n_keep: int) -> None:
        if self.n_fed > n_keep:
            self.ctx.seq_rm(n_keep)
            self.n_fed = n_keep
            self._kept_pos[self._kept_pos >= n_keep] = -1
            self._pinned = {p: h for p, h in self._pinned.items() if p < n_keep}

    def on_target_decode(self, target_ctx: Context, start_pos: int, n_committed: int) -> None:
        if start_pos < self.n_fed:
            self.rollback(start_pos)
        if start_pos != self.n_fed or start_pos + n_committed > self.ctx_limit:
            return  # a gap (or past the MTP cache): no drafts until the next prompt fills it again
        rows = nextn_rows(target_ctx, target_ctx.n_last)[:n_committed]
        first = self._hidden_at(start_pos - 1)
        if first is None:
            self.unpaired += 1
            first = self._zero
        pairs = np.empty((n_committed, rows.shape[1]), np.float32)
        pairs[0] = first
        pairs[1:] = rows[:-1]
        tokens = target_ctx.last_tokens()[:n_committed].copy()
        self.ctx.decode_pairs(tokens, pairs, start_pos, output_last=False)
        tail = range(max(0, n_committed - HIDDEN_KEPT), n_committed)
        for i in tail:
            p = start_pos + i
            self._kept[p % HIDDEN_KEPT] = rows[i]
            self._kept_pos[p % HIDDEN_KEPT] = p
        self.n_fed = start_pos + n_committed

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        if k <= 0 or self.n_fed != n_past or n_past + k > self.ctx_limit:
            return []
        h = self._hidden_at(n_past - 1)
        if h is None:
            return []
        tok = history[-1]
        drafts: list[int] = []
        for i in range(k):
            self.ctx.decode_pairs([tok], h[None], n_past + i, output_last=True)
            logits = self.ctx.logits(-1)
            tok = int(np.argmax(logits))
            if self.p_min > 0.0 and 1.0 / np.exp(logits - logits[tok]).sum() < self.p_min:
                break
            drafts.append(tok)
            if len(drafts) < k:
                h = self.ctx.hidden()
        self.ctx.seq_rm(n_past)  # the draft steps leave the cache; verify feeds the committed ones back
        return drafts

    def close(self) -> None:
        self.ctx.close()
