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
from localflash.llama.nextn import MtpContext, MtpView, decode_pair_views, enable_nextn, nextn_rows
from localflash.speculative.drafter import Drafter
from localflash.speculative.group import Ask, DrafterGroup, Taken

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
                 n_threads: int = 0, kv: str = "f16", group: "MtpGroup | None" = None, seq: int = 0):
        self.max_draft = max_draft
        self.p_min = p_min
        self.owner = group is None
        if group is None:
            self.ctx = mtp_context(target, target_ctx, n_ctx, n_threads, kv)
            self.ctx_limit = self.ctx.n_ctx
        else:  # its share of the group's context: positions 0..n_ctx-1 of sequence ``seq``
            self.ctx = MtpView(group.ctx, seq)
            self.ctx_limit = min(n_ctx, self.ctx.n_ctx)
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
        pairs = self.pairs(target_ctx, start_pos, n_committed)
        if pairs is not None:
            self.ctx.decode_pairs(*pairs, start_pos, output_last=False)
            self.n_fed = start_pos + n_committed

    def pairs(self, target_ctx, start_pos: int, n_committed: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens, hidden states) to feed for rows committed at ``start_pos..``, keeping their hidden states for
        later drafts; None on a gap (or past the MTP cache): no drafts until the next prompt fills it again."""
        if start_pos < self.n_fed:
            self.rollback(start_pos)
        if start_pos != self.n_fed or start_pos + n_committed > self.ctx_limit:
            return None
        rows = nextn_rows(target_ctx, target_ctx.n_last)[:n_committed]
        first = self._hidden_at(start_pos - 1)
        if first is None:
            self.unpaired += 1
            first = self._zero
        pairs = np.empty((n_committed, rows.shape[1]), np.float32)
        pairs[0] = first
        pairs[1:] = rows[:-1]
        tokens = target_ctx.last_tokens()[:n_committed].copy()
        tail = range(max(0, n_committed - HIDDEN_KEPT), n_committed)
        for i in tail:
            p = start_pos + i
            self._kept[p % HIDDEN_KEPT] = rows[i]
            self._kept_pos[p % HIDDEN_KEPT] = p
        return tokens, pairs

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        h = self.anchor(n_past, k)
        if h is None:
            return []
        tok = history[-1]
        drafts: list[int] = []
        for i in range(k):
            self.ctx.decode_pairs([tok], h[None], n_past + i, output_last=True)
            if not self.next(drafts, k):
                break
            tok, h = drafts[-1], self.ctx.hidden()
        self.ctx.seq_rm(n_past)  # the draft steps leave the cache; verify feeds the committed ones back
        return drafts

    def anchor(self, n_past: int, k: int) -> np.ndarray | None:
        """The hidden state a draft of ``k`` tokens after position ``n_past`` starts from; None: no draft."""
        if k <= 0 or self.n_fed != n_past or n_past + k > self.ctx_limit:
            return None
        return self._hidden_at(n_past - 1)

    def next(self, drafts: list[int], k: int) -> bool:
        """Append the next greedy draft from the last decode's logits unless ``p_min`` stops it; whether to go on."""
        logits = self.ctx.logits(-1)
        tok = int(np.argmax(logits))
        if self.p_min > 0.0 and 1.0 / np.exp(logits - logits[tok]).sum() < self.p_min:
            return False
        drafts.append(tok)
        return len(drafts) < k

    def close(self) -> None:
        if self.owner:  # a group's slot drafter: the group closes the shared context
            self.ctx.close()


def mtp_context(target: Model, target_ctx: Context, n_ctx: int, n_threads: int = 0, kv: str = "f16", n_seq: int = 1) -> MtpContext:
    """The MTP context on the target model: ``n_ctx`` positions for each of ``n_seq`` sequences (slots), one unified KV."""
    check_mtp_target(target)
    enable_nextn(target_ctx, masked=False)
    return MtpContext(target, ContextOptions(
        n_ctx=n_ctx * n_seq, n_batch=target_ctx.n_batch, n_ubatch=min(512, target_ctx.n_batch), n_outputs_max=n_seq,
        n_threads=n_threads, type_k=kv, type_v=kv, n_seq_max=n_seq, kv_unified=True))


class MtpGroup(DrafterGroup):
    """Every slot's MTP drafter on sequence i of one shared MTP context: one intake decode per step for all slots,
    and one decode per draft position carrying a row of every slot still drafting."""

    shared_draft = True

    def __init__(self, target: Model, target_ctx: Context, n_ctx: int, n_seq: int, max_draft: int = 3, p_min: float = 0.0,
                 n_threads: int = 0, kv: str = "f16"):
        self.ctx = mtp_context(target, target_ctx, n_ctx, n_threads, kv, n_seq)
        super().__init__([MtpDrafter(target, target_ctx, n_ctx, max_draft, p_min, group=self, seq=i) for i in range(n_seq)])

    def on_target_decode(self, taken: list[Taken]) -> None:
        parts, fed = [], []
        for i, view, start, n in taken:
            d = self.drafters[i]
            pairs = d.pairs(view, start, n)
            if pairs is not None:
                parts.append((d.ctx, *pairs, start, False))
                fed.append((d, start + n))
        if parts:
            decode_pair_views(self.ctx, parts)
            for d, n_fed in fed:
                d.n_fed = n_fed

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in asks]
        live, started = [], []
        for j, (i, history, n_past, k) in enumerate(asks):
            d = self.drafters[i]
            k = min(k, d.max_draft)
            h = d.anchor(n_past, k)
            if h is not None:
                live.append((j, d, k, n_past, history[-1], h))
                started.append((d, n_past))
        step = 0
        while live:
            decode_pair_views(self.ctx, [(d.ctx, [tok], h[None], n_past + step, True) for _j, d, _k, n_past, tok, h in live])
            live = [(j, d, k, n_past, out[j][-1], d.ctx.hidden()) for j, d, k, n_past, _tok, _h in live if d.next(out[j], k)]
            step += 1
        for d, n_past in started:
            d.ctx.seq_rm(n_past)  # the draft steps leave the cache; verify feeds the committed ones back
        return out

    def close(self) -> None:
        self.ctx.close()
