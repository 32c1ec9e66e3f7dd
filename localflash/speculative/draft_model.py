"""A small autoregressive GGUF model as drafter (same vocabulary as the target)."""

from __future__ import annotations

import numpy as np

from ..errors import LocalflashError
from ..llama import Context, ContextOptions, Model
from .drafter import Drafter


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


class DraftModelDrafter(Drafter):
    """Greedy drafting with a ``p_min`` confidence cut-off; its KV follows the committed text."""

    name = "draft"

    def __init__(self, model: Model, target: Model, n_ctx: int, max_draft: int = 8, p_min: float = 0.0, n_threads: int = 0):
        check_same_vocab(target, model)
        self.model = model
        self.max_draft = max_draft
        self.p_min = p_min
        self.ctx = Context(model, ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_outputs_max=1, n_threads=n_threads))
        self.kv: list[int] = []  # tokens in the draft cache, positions 0..len-1
        self.ctx_limit = self.ctx.n_ctx - 1

    def rollback(self, n_keep: int) -> None:
        if len(self.kv) > n_keep:
            self.ctx.seq_rm(n_keep)
            del self.kv[n_keep:]

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        if k <= 0:
            return []
        p = _common_prefix(self.kv, history)
        if p == len(history):
            p -= 1
        self.rollback(p)
        for off in range(p, len(history), self.ctx.n_batch):
            chunk = history[off : off + self.ctx.n_batch]
            self.ctx.decode(chunk, off, "last" if off + len(chunk) == len(history) else "none")
        self.kv = list(history)
        drafts: list[int] = []
        while True:
            logits = self.ctx.logits(-1)
            tok = int(np.argmax(logits))
            if self.p_min > 0.0 and 1.0 / np.exp(logits - logits[tok]).sum() < self.p_min:
                break
            drafts.append(tok)
            if len(drafts) == k:
                break
            self.ctx.decode([tok], len(self.kv), "last")
            self.kv.append(tok)
        return drafts

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n
