"""DFlash: a block-diffusion drafter that proposes a whole block in one forward.

It runs inside llama.cpp (arch ``dflash``) and borrows the target's token
embedding and LM head through ``ctx_other``. After every target decode the
committed rows' inputs of the tapped target layers are concatenated and
injected into the drafter's KV cache at the same positions; a draft is one
decode of ``[last committed token, MASK × (B-1)]`` whose rows 1.. are read
greedily, after which the noise block is dropped from the drafter's cache.

DFlash2 files (``dflash.selector_top_k`` > 0: two-tap dynamic convolutions
and a candidate selector) are driven the same way, except that the draft is
read from the selector's *lattice* instead of the logits: for every block
position the graph outputs its top-k candidate ids and a k x k table of
scores (one row per candidate chosen at the previous position). The draft
walks it: position 1 scores against the anchor token, each later position
takes the best-scoring candidate given the one chosen before it, and with
``p_min`` the walk stops where the softmax of that score row gives the
chosen candidate less than ``p_min``.
"""

from __future__ import annotations

import numpy as np

from localflash.archs import LAYER_INPUT_ARCHS
from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model, gpu_offload_supported
from localflash.speculative.drafter import Drafter
from localflash.speculative.tree import TOP_K, Tree, best_first, top_candidates_rows


def check_dflash_pair(target: Model, drafter: Model) -> list[int]:
    """Validate a DFlash drafter against its target; return the layer ids to tap."""
    if drafter.arch != "dflash":
        hint = "use --spec eagle3 for an EAGLE-3 drafter" if drafter.arch == "eagle3" else None
        raise LocalflashError(f"{drafter.path.name} is a {drafter.arch!r} model, not a DFlash drafter", hint=hint)
    if target.arch not in LAYER_INPUT_ARCHS:
        raise LocalflashError(
            f"target arch {target.arch!r} cannot export layer inputs, which DFlash needs",
            hint="use --spec draft with a small model of the same family, or --spec ngram",
        )
    ids = drafter.target_layer_ids()
    if not ids:
        raise LocalflashError(f"{drafter.path.name} names no target layers (dflash.target_layers)")
    if max(ids) >= target.n_layer or min(ids) < 0:
        raise LocalflashError(
            f"drafter taps target layers {ids} but {target.path.name} has {target.n_layer} layers",
            hint="this drafter was made for a different (deeper) target",
        )
    if drafter.n_embd != target.n_embd:
        raise LocalflashError(
            f"drafter fuses {len(ids)} x {drafter.n_embd} features but the target gives "
            f"{len(ids)} x {target.n_embd}",
            hint="this drafter was made for a target of another width",
        )
    if drafter.n_vocab != target.n_vocab:
        raise LocalflashError(
            f"drafter vocabulary ({drafter.n_vocab}) differs from the target's ({target.n_vocab})"
        )
    return ids


def walk_lattice(rows: np.ndarray, top_k: int, k: int, p_min: float = 0.0) -> list[int]:
    """Up to ``k`` draft tokens from a DFlash2 selector lattice (``rows[0]`` is the anchor's, unused).

    Row ``i`` holds ``top_k`` candidate ids (as floats) and then ``top_k`` score
    rows of ``top_k``, one per predecessor candidate; position 1's rows are all
    the anchor's, so predecessor 0 reads them.
    """
    drafts: list[int] = []
    pred = 0
    for row in rows[1 : k + 1]:
        scores = row[top_k + pred * top_k : top_k + (pred + 1) * top_k]
        pred = int(np.argmax(scores))
        if p_min > 0.0 and 1.0 / float(np.exp(scores - scores[pred]).sum()) < p_min:
            break
        drafts.append(int(row[pred]))
    return drafts


class DFlashDrafter(Drafter):
    name = "dflash"
    cost_grows_with_length = False

    def __init__(self, model: Model, target: Model, target_ctx: Context, n_ctx: int, n_threads: int = 0, p_min: float = 0.0,
                 in_graph_argmax: bool | None = None):
        self.layer_ids = check_dflash_pair(target, model)
        self.model = model
        self.block_size = int(model.meta("dflash.block_size") or 16)
        self.max_draft = self.block_size - 1
        self.top_k = model.dflash_selector_top_k()  # > 0: a DFlash2 file, drafted from its selector lattice
        self.p_min = p_min if self.top_k else 0.0
        if self.top_k:
            self.name = "dflash2"
        self.mask = model.mask_token()
        if self.mask < 0:
            raise LocalflashError(f"{model.path.name} has no mask token (tokenizer.ggml.mask_token_id)")
        self.ctx = Context(
            model,
            ContextOptions(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_outputs_max=self.block_size, n_threads=n_threads),
            other=target_ctx,
        )
        self.ctx.set_causal((model.meta("dflash.attention.causal") or "false").lower() == "true")
        if self.top_k:
            self.ctx.output_nextn(masked=False)  # the lattice has a row per block position, logits are not read
        # DFlash drafts are read greedily. On a GPU, llama.cpp takes the argmax in its graph, so only ids cross
        # the bus (a block's logits are 16 x n_vocab floats). Not on a CPU: ggml's CPU argmax is one
        # scalar thread (~250 us per 248,320-token row), NumPy's is SIMD. None: decide by the build.
        if in_graph_argmax is None:
            in_graph_argmax = gpu_offload_supported()
        self.in_graph = bool(in_graph_argmax) and not self.top_k and self.ctx.sample_greedy_in_graph()
        target_ctx.capture_layer_inputs(self.layer_ids)
        self.n_injected = 0  # positions 0..n_injected-1 carry target features
        self.ctx_limit = self.ctx.n_ctx - self.block_size

    def rollback(self, n_keep: int) -> None:
        if self.n_injected > n_keep:
            self.ctx.seq_rm(n_keep)
            self.n_injected = n_keep

    def on_target_decode(self, target_ctx: Context, start_pos: int, n_committed: int) -> None:
        if start_pos != self.n_injected or start_pos + n_committed > self.ctx_limit:
            return  # past the drafter's context (or after a gap): no features, so no drafts from here
        rows = target_ctx.n_last  # each tapped layer's rows go straight into the drafter's batch, side by side
        self.ctx.decode_embd(target_ctx.layer_inputs(self.layer_ids, rows), start_pos, n_committed)
        self.n_injected = start_pos + n_committed

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        if k <= 0 or self.n_injected != n_past:
            return []
        # always draft the full block: the drafter was trained on it and its cost barely depends on k
        block = [history[-1]] + [self.mask] * self.max_draft
        if self.top_k:
            self.ctx.decode(block, n_past, "none")
            drafts = walk_lattice(self.ctx.nextn_rows(len(block)), self.top_k, k, self.p_min)
        else:
            self.ctx.decode(block, n_past, "all")
            if self.in_graph:
                drafts = self.ctx.sampled_rows(1, k + 1)
            else:
                drafts = self.ctx.all_logits()[1 : k + 1].argmax(axis=1).tolist()
        self.ctx.seq_rm(n_past)
        return drafts

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int) -> Tree:
        """DDTree: the block's per-position top candidates, grown best-first by cumulative drafter probability.

        DFlash1 positions are marginals given the anchor, so a node's children are its depth's candidates;
        DFlash2's selector scores each candidate given the one before it, so they depend on the node.
        """
        k = min(k, self.max_draft)
        if k <= 0 or self.n_injected != n_past or self.in_graph:  # in-graph argmax: no logits to branch on
            return Tree.chain(history[-1], self.propose(history, n_past, min(k, budget)))
        block = [history[-1]] + [self.mask] * self.max_draft
        if self.top_k:
            self.ctx.decode(block, n_past, "none")
            rows = self.ctx.nextn_rows(len(block))
            kk = self.top_k

            def expand(depth, pred):
                row = rows[depth + 1]
                scores = row[kk + pred * kk : kk + (pred + 1) * kk].astype(np.float64)
                order = np.argsort(-scores, kind="stable")
                logp = scores - scores.max() - np.log(np.exp(scores - scores.max()).sum())
                return row[order].astype(np.int64), logp[order], order

            tree = best_first(history[-1], expand, budget, k, root_state=0)
        else:
            self.ctx.decode(block, n_past, "all")
            ids, logp = top_candidates_rows(self.ctx.all_logits()[1 : k + 1], TOP_K)
            tree = best_first(history[-1], lambda depth, _: (ids[depth], logp[depth], None), budget, k)
        self.ctx.seq_rm(n_past)
        return tree

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
