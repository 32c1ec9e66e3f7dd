"""DSpark: a DFlash drafter with a Markov head and a confidence head, driven as llama.cpp's ``draft-dspark``.

A DSpark file is a ``dflash`` GGUF with two more heads (``src/models/dflash.cpp``,
``build_dspark_markov_head``), both run inside llama.cpp's graph:

- the **Markov head** (``markov_w1`` ``[n_vocab, R]``, ``markov_w2`` ``[n_vocab, R]``)
  adds ``markov_w2 · markov_w1[prev]`` to each block position's logits, ``prev``
  being the token chosen at the position before it (the anchor for the first),
  chained greedily by argmax: the logits a decode returns are already corrected;
- the **confidence head** (``conf_proj``, optional) gives each position
  ``sigmoid(conf_proj · [h; markov_w1[prev]] + b)``, an estimate that the
  position's token is accepted, exported as the position's ``h_nextn`` row.

The block is **anchor-first** (``dflash.sample_from_anchor``, default true): the
input is DFlash's ``[last committed token, MASK x (B-1)]`` but row ``i``
predicts the token after position ``n_past + i``, so one decode drafts B tokens
(rows 0..B-1), not B-1. With ``sample_from_anchor`` false (SpecForge exports)
slot 0 is a bonus anchor and rows 1.. are read, as DFlash does. ``p_min`` > 0
cuts the draft at the first position whose confidence is below it (llama.cpp:
``common_speculative_impl_draft_dflash::draft``); it is refused in one line for
a file without a confidence head. Draft tokens are the argmax of the corrected
rows, which is the chain the Markov head conditioned on.

Trees: the block's positions depend on the chain through the Markov head, so a
node off the chain has no distribution of its own to expand; the tree is the
chain plus, at each depth, the next-best tokens of that position as leaves
(:func:`~localflash.speculative.tree.chain_with_siblings`). With a confidence
head the confidence sets the width: a chain node scores ``log conf`` and a
sibling ``log(1 - conf) + log(p / (1 - p_chain))`` (it is reached only when the
chain's token is rejected), so best-first spends the budget on side leaves where
the drafter is unsure and on depth where it is sure.

DeepSeek-V4-backbone DSpark files (``dflash.hyper_connection.count`` > 0) are
refused: their targets (``deepseek4``) are far beyond what localflash plans for
and no public file or tiny fixture exists to check a driver against.
"""

from __future__ import annotations

import numpy as np

from localflash.archs import DSPARK_DSV4_REFUSAL
from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import read_meta
from localflash.speculative.dflash import DFlashDrafter, is_dspark
from localflash.speculative.tree import TOP_K, Tree, chain_with_siblings, top_candidates_rows

DSV4_HINT = "use a DSpark drafter with a Qwen3-style (DFlash) backbone"
NO_CONFIDENCE = "{name} is a DSpark drafter without a confidence head, so --p-min cannot cut its drafts"


def dspark_layout(model) -> tuple[bool, bool, bool]:
    """(is DSpark, anchor-first, has a confidence head) of a loaded ``dflash`` drafter, from its GGUF header."""
    meta = read_meta(model.path)
    return meta.is_dspark, meta.sample_from_anchor, meta.dspark_confidence


def check_dspark(meta, p_min: float) -> None:
    """Refuse in one line what this driver does not run: a DSV4 backbone, or ``p_min`` without a confidence head."""
    name = meta.path.name
    if meta.dsv4_backbone:
        raise LocalflashError(DSPARK_DSV4_REFUSAL.format(name=name), hint=DSV4_HINT)
    if p_min > 0 and not meta.dspark_confidence:
        raise LocalflashError(NO_CONFIDENCE.format(name=name), hint="drop --p-min (or use --p-min 0)")


def confidence_cut(conf: np.ndarray, p_min: float) -> int:
    """How many positions survive the confidence cut: up to the first below ``p_min``."""
    low = np.flatnonzero(conf < p_min)
    return int(low[0]) if low.size else len(conf)


def dflash_drafter(model, *args, **kw) -> DFlashDrafter:
    """The drafter a ``dflash`` file is driven by: DSpark's for a file with a Markov head, else :class:`DFlashDrafter`."""
    if is_dspark(model):
        return DSparkDrafter(model, *args, **kw)
    return DFlashDrafter(model, *args, **kw)


class DSparkDrafter(DFlashDrafter):
    """A DSpark drafter: DFlash's cache and intake; the anchor-first read, the confidence cut and its trees."""

    name = "dspark"

    def __init__(self, model, target, target_ctx, n_ctx: int, n_threads: int = 0, p_min: float = 0.0,
                 in_graph_argmax: bool | None = None, group=None, seq: int = 0, kv: str = "f16"):
        meta = read_meta(model.path)
        check_dspark(meta, p_min)
        # in-graph argmax off: the drafts are read from the corrected logits, and the confidence beside them
        super().__init__(model, target, target_ctx, n_ctx, n_threads, p_min=0.0, in_graph_argmax=False, group=group, seq=seq, kv=kv)
        self.in_graph = False
        self.anchor = meta.sample_from_anchor
        self.first_row = 0 if self.anchor else 1
        self.max_draft = self.block_size - self.first_row
        self.has_confidence = meta.dspark_confidence
        self.p_min = p_min
        self.last_confidence: np.ndarray | None = None  # the last draft's per-position confidence (with a head)

    @property
    def outputs(self) -> str:
        return "all"

    def block(self, history: list[int]) -> list[int]:
        """DFlash's block of ``block_size`` tokens whichever the layout: anchor-first reads all of its rows."""
        return [history[-1]] + [self.mask] * (self.block_size - 1)

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        """DFlash's propose over DSpark's block (its base inlines ``block_size - 1`` masks after the anchor:
        an anchor-first file has one draft row more, so the block here stays ``block_size`` long)."""
        k = min(k, self.max_draft)
        if k <= 0 or self.n_injected != n_past:
            return []
        if self.n_held:
            self.catch_up()
        self.asked = True
        self.ctx.decode(self.block(history), n_past, "all")
        drafts = self.read(k)
        self.ctx.seq_rm(n_past)
        return drafts

    def _rows(self, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        lo = self.first_row
        logits = self.ctx.all_logits()[lo : lo + k]
        conf = self.ctx.nextn_rows(self.block_size)[lo : lo + k, 0].copy() if self.has_confidence else None
        self.last_confidence = conf
        return logits, conf

    def read(self, k: int) -> list[int]:
        """Up to ``k`` drafts: the corrected rows' argmax, cut at the first confidence below ``p_min``."""
        logits, conf = self._rows(k)
        n = confidence_cut(conf, self.p_min) if self.p_min > 0 else len(logits)
        return logits[:n].argmax(axis=1).tolist()

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int) -> Tree:
        k = min(k, self.max_draft)
        if k <= 0 or self.n_injected != n_past:
            return Tree.chain(history[-1], [])
        self.catch_up()
        self.asked = True
        self.ctx.decode(self.block(history), n_past, "all")
        logits, conf = self._rows(k)
        n = confidence_cut(conf, self.p_min) if self.p_min > 0 else len(logits)
        ids, logp = top_candidates_rows(logits[:n], TOP_K)
        chain = ids[:, 0].tolist()
        if conf is not None:
            logp = confidence_scores(logp, conf[:n])
        tree = chain_with_siblings(history[-1], chain, list(zip(ids, logp)), budget)
        self.ctx.seq_rm(n_past)
        return tree


def confidence_scores(logp: np.ndarray, conf: np.ndarray) -> np.ndarray:
    """Per depth: the chain token (column 0) scores ``log conf``, a sibling ``log(1 - conf) + log(p / (1 - p_chain))``."""
    eps = 1e-6
    c = np.clip(conf.astype(np.float64), eps, 1 - eps)[:, None]
    p_chain = np.exp(logp[:, :1])
    rest = np.log(np.maximum(1.0 - p_chain, eps))
    out = np.log(1 - c) + logp - rest
    out[:, 0] = np.log(c[:, 0])
    return out
