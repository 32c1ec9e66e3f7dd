"""A small autoregressive GGUF model as drafter (same vocabulary as the target)."""

from __future__ import annotations

import numpy as np

from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model, SeqView
from localflash.llama.sequences import decode_views
from localflash.speculative.drafter import Drafter
from localflash.speculative.group import Ask, DrafterGroup
from localflash.speculative.tree import Tree, chain_with_siblings, top_candidates


def check_same_vocab(target: Model, drafter: Model, samples: int = 256) -> None:
    """Raise unless both models tokenize alike: same size and same token strings."""
    if abs(target.n_vocab - drafter.n_vocab) > 128:
        raise LocalflashError(
            f"drafter vocabulary ({drafter.n_vocab} tokens) differs from the target's ({target.n_vocab})",
            hint="a draft model must share the target's tokenizer; try --spec ngram",
        )
    n = min(target.n_vocab, drafter.n_vocab)
    ids = np.unique(np.concatenate([np.arange(min(n, 64)), np.linspace(0, n - 1, samples).astype(int)]))
    for i in ids:
        a, b = target.token_text(int(i)), drafter.token_text(int(i))
        if a != b:
            raise LocalflashError(
                f"drafter token {int(i)} is {b!r} but the target's is {a!r}: different tokenizers",
                hint="a draft model must share the target's tokenizer; try --spec ngram",
            )


CATCH_UP_MAX = 64  # after a long stretch without drafting, decode at most this many of the missed tokens


class DraftModelDrafter(Drafter):
    """Greedy drafting with a ``p_min`` confidence cut-off; its KV follows the committed text.

    While the engine is not drafting (the adaptive length chose 0), the draft
    cache falls behind. When a probe finds more than ``CATCH_UP_MAX`` tokens
    missing, the draft cache is emptied and only the last ``CATCH_UP_MAX``
    tokens are decoded, at their true positions (llama.cpp needs a sequence's
    positions to be consecutive, which an empty cache allows to start
    anywhere): a rare probe costs a bounded amount, and the drafter drafts
    from that window until the next prompt rebuilds it. Drafts are only proposals,
    checked by the target like any other.
    """

    name = "draft"
    lazy_prompt = True  # a lagging cache is caught up by the next draft, within CATCH_UP_MAX tokens

    def __init__(self, model: Model, target: Model, n_ctx: int, max_draft: int = 8, p_min: float = 0.0, n_threads: int = 0,
                 group: "DraftModelGroup | None" = None, seq: int = 0, kv: str = "f16"):
        self.model = model
        self.max_draft = max_draft
        self.p_min = p_min
        self.owner = group is None
        if group is None:
            check_same_vocab(target, model)
            self.ctx = Context(model, ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_outputs_max=1, n_threads=n_threads,
                                                     type_k=kv, type_v=kv))
            self.ctx_limit = self.ctx.n_ctx - 1
        else:  # its share of the group's context: positions 0..n_ctx-1 of sequence ``seq``
            self.ctx = SeqView(group.ctx, seq)
            self.ctx_limit = min(n_ctx, self.ctx.n_ctx) - 1
        self.kv: list[int] = []  # tokens in the draft cache, positions 0..len-1
        self.window_start = 0  # > 0: positions before it were dropped by a bounded catch-up

    def rollback(self, n_keep: int) -> None:
        if len(self.kv) > n_keep:
            del self.kv[self.ctx.rewind(n_keep) :]  # a hybrid drafter may resume earlier (its checkpoint)

    def on_prompt(self, prompt: list[int]) -> None:
        """Decode the prompt into the draft cache now, while the target prefills, not in the first cycle."""
        if self.window_start:  # a windowed cache: rebuild it whole
            self.rollback(0)
            self.window_start = 0
        self._catch_up(prompt, want_logits=False)

    def _catch_up(self, tokens: list[int], want_logits: bool, max_gap: int | None = None) -> None:
        """Make the draft cache hold ``tokens`` (decoding what it lacks); with ``want_logits`` the last row is output.

        With ``max_gap``, more missing tokens than that empty the cache, and only the last
        ``max_gap`` tokens are decoded; ``kv`` still lists every position, as the window's
        positions (and any later rollback) are those of the full text.
        """
        start, todo = self._missing(tokens, want_logits, max_gap)
        for off in range(0, len(todo), self.ctx.n_batch):
            chunk = todo[off : off + self.ctx.n_batch]
            final = off + len(chunk) == len(todo)
            self.ctx.decode(chunk, start + off, "last" if final and want_logits else "none")

    def _missing(self, tokens: list[int], want_logits: bool, max_gap: int | None) -> tuple[int, list[int]]:
        """Cut the draft cache back to what it shares with ``tokens``; (position, tokens) it must decode to hold them.

        ``kv`` lists them already: the caller decodes them next (:meth:`_catch_up`, or a group's one decode for all).
        """
        p = _common_prefix(self.kv, tokens)
        if want_logits and p == len(tokens):
            p -= 1  # re-decode the last token to get its logits
        self.rollback(p)
        start = p = min(p, len(self.kv))
        if max_gap is not None and len(tokens) - p > max_gap:
            self.ctx.seq_rm(0)
            start = self.window_start = len(tokens) - max_gap
        self.kv += tokens[p:]
        return start, tokens[start:]

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        if k <= 0:
            return []
        return self._draft(history, k)

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int) -> Tree:
        """The greedy chain plus each step's next-best tokens as side leaves (best-first by cumulative probability)."""
        k = min(k, self.max_draft, budget)
        steps: list = []
        chain = self._draft(history, k, steps) if k > 0 else []
        return chain_with_siblings(history[-1], chain, steps, budget)

    def _draft(self, history: list[int], k: int, steps: list | None = None) -> list[int]:
        """Greedy drafts; with ``steps``, each step's top candidates and log-probabilities are appended to it."""
        self._catch_up(history, want_logits=True, max_gap=CATCH_UP_MAX)
        # a hybrid drafter's rejected tokens span several one-token decodes, which no snapshot
        # undoes: keep its state here, restored (and the accepted tokens replayed) next cycle
        self.ctx.checkpoint(transient=True)
        drafts: list[int] = []
        while self._next(drafts, k, steps):
            self.ctx.decode([drafts[-1]], len(self.kv), "last")
            self.kv.append(drafts[-1])
        return drafts

    def _next(self, drafts: list[int], k: int, steps: list | None = None) -> bool:
        """Append the next greedy draft (from the last decode's logits) unless ``p_min`` stops it; whether to go on."""
        logits = self.ctx.logits(-1)
        tok = int(np.argmax(logits))
        if self.p_min > 0.0 and 1.0 / np.exp(logits - logits[tok]).sum() < self.p_min:
            return False
        drafts.append(tok)
        if steps is not None:
            steps.append(top_candidates(logits))
        return len(drafts) < k

    def close(self) -> None:
        if self.owner:  # a group's slot drafter: the group closes the shared context and the model
            self.ctx.close()
            self.model.close()


class DraftModelGroup(DrafterGroup):
    """Every slot's draft model on sequence i of one shared context: a step's drafts in 1 + (k - 1) decodes for all slots.

    The first decode brings every drafting slot's cache up to its history (each slot's missing tokens, its last
    row output), then each decode carries one row per slot still drafting. ``n_ctx`` positions per slot, in one
    unified KV (a hybrid drafter: a recurrent state per sequence, cut back through per-sequence checkpoints).
    """

    shared_draft = True

    def __init__(self, model: Model, target: Model, n_ctx: int, n_seq: int, max_draft: int = 8, p_min: float = 0.0,
                 n_threads: int = 0, kv: str = "f16"):
        check_same_vocab(target, model)
        self.model = model
        self.ctx = Context(model, ContextOptions(n_ctx=n_ctx * n_seq, n_batch=512, n_ubatch=512, n_outputs_max=n_seq,
                                                 n_threads=n_threads, n_seq_max=n_seq, kv_unified=True, type_k=kv, type_v=kv))
        super().__init__([DraftModelDrafter(model, target, n_ctx, max_draft, p_min, group=self, seq=i) for i in range(n_seq)])

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in asks]
        live = []  # (ask index, drafter, k)
        parts, rows = [], 0
        for j, (i, history, _n_past, k) in enumerate(asks):
            d = self.drafters[i]
            k = min(k, d.max_draft)
            if k <= 0:
                continue
            start, todo = d._missing(history, True, CATCH_UP_MAX)
            if rows + len(todo) > self.ctx.n_batch:  # a full batch: decode it, start the next
                decode_views(self.ctx, parts)
                self._first(parts, live, out)
                parts, rows = [], 0
            parts.append((d.ctx, todo, start, "last"))
            rows += len(todo)
            live.append((j, d, k))
        if parts:
            decode_views(self.ctx, parts)
            self._first(parts, live, out)
        while live:  # one row per slot still drafting
            decode_views(self.ctx, [(d.ctx, [out[j][-1]], len(d.kv), "last") for j, d, _k in live])
            for j, d, _k in live:
                d.kv.append(out[j][-1])
            live = [(j, d, k) for j, d, k in live if d._next(out[j], k)]
        return out

    @staticmethod
    def _first(parts: list, live: list, out: list) -> None:
        """The first draft of the slots whose catch-up the last decode carried; those that go on stay in ``live``."""
        caught = {id(view) for view, *_ in parts}
        for j, d, k in list(live):
            if id(d.ctx) in caught:
                d.ctx.checkpoint(transient=True)  # a hybrid drafter's state before its drafts: restored next cycle
                if not d._next(out[j], k):
                    live.remove((j, d, k))

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def _common_prefix(a: list[int], b: list[int], tail: int = 64) -> int:
    """Length of the common prefix of two token lists.

    Each cycle the lists agree except near their ends (the last draft against
    the accepted tokens), so one C-level comparison of all but the last
    ``tail`` items settles almost every call; the rest is scanned.
    """
    n = min(len(a), len(b))
    h = max(0, n - tail)
    if a[:h] != b[:h]:
        diff = np.flatnonzero(np.asarray(a[:h]) != np.asarray(b[:h]))
        return int(diff[0])
    for i in range(h, n):
        if a[i] != b[i]:
            return i
    return n
