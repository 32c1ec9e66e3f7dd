"""DFlash: a block-diffusion drafter that proposes a whole block in one forward.

It runs inside llama.cpp (arch ``dflash``) and borrows the target's token
embedding and LM head through ``ctx_other``. After every target decode the
committed rows' inputs of the tapped target layers are concatenated and
injected into the drafter's KV cache at the same positions; a draft is one
decode of ``[last committed token, MASK × (B-1)]`` whose rows 1.. are read
greedily, after which the noise block is dropped from the drafter's cache.
While the draft-length policy keeps drafting off, the committed rows' features
are held on the host (up to ``HOLD_ROWS``) and go in with one decode when the
drafter next drafts or the hold is full, not with one decode per target step.

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
from localflash.formats.gguf_meta import read_meta
from localflash.llama import Context, ContextOptions, Model, SeqView, gpu_offload_supported
from localflash.llama.sequences import decode_embd_views, decode_views
from localflash.speculative.drafter import Drafter
from localflash.speculative.group import Ask, DrafterGroup, Taken
from localflash.speculative.tree import TOP_K, Tree, best_first, top_candidates_rows

# committed rows an idle drafter holds on the host before it takes them in, all in one decode: a drafter
# decode costs about the same for 1 row as for dozens, so plain steps (the policy drafting nothing) pay a
# row copy each, not a decode each; a drafter that drafts every cycle takes its rows straight in
HOLD_ROWS = 64


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


def dflash_context(model: Model, target_ctx: Context, n_ctx: int, n_threads: int = 0, n_seq: int = 1, kv: str = "f16") -> Context:
    """The drafter's context: ``n_ctx`` positions for each of ``n_seq`` sequences (slots), in one unified KV.

    Unified: llama.cpp then takes a batch of several sequences as one micro-batch (``split_simple``;
    per-sequence streams split it by equal lengths and consecutive ids), and the attention mask keeps
    the sequences apart (``llama-kv-cache.cpp`` set_input_kq_mask: a cell of another sequence is
    masked, causal or not). DFlash2's in-block convolutions and selector take each sequence's block
    as one of the micro-batch's ``n_seqs_unq`` equal blocks (``models/dflash.cpp``).
    """
    block = int(model.meta("dflash.block_size") or 16)
    ctx = Context(model, ContextOptions(n_ctx=n_ctx * n_seq, n_batch=512, n_ubatch=512, n_outputs_max=min(512, block * n_seq),
                                        n_threads=n_threads, n_seq_max=n_seq, kv_unified=True, type_k=kv, type_v=kv), other=target_ctx)
    ctx.set_causal((model.meta("dflash.attention.causal") or "false").lower() == "true")
    if model.dflash_selector_top_k() or is_dspark(model):
        # DFlash2: the lattice has a row per block position, logits are not read; DSpark: each position's confidence
        ctx.output_nextn(masked=False)
    return ctx


def is_dspark(model: Model) -> bool:
    """Whether a ``dflash`` drafter is a DSpark file (a Markov head: ``markov_w1``), as llama.cpp tells them apart."""
    return read_meta(model.path).is_dspark



def greedy_in_graph(ctx: Context, in_graph_argmax: bool | None, top_k: int, n_seq: int = 1) -> bool:
    """Whether DFlash1 drafts are argmaxed in llama.cpp's graph (a chain is then attached to ``ctx``).

    On a GPU, llama.cpp takes the argmax in its graph, so only ids cross the bus (a block's logits are
    16 x n_vocab floats). Not on a CPU: ggml's CPU argmax is one scalar thread (~250 us per 248,320-token
    row), NumPy's is SIMD. None: decide by the build.
    """
    if in_graph_argmax is None:
        in_graph_argmax = gpu_offload_supported()
    return bool(in_graph_argmax) and not top_k and ctx.sample_greedy_in_graph(n_seq)


class DFlashDrafter(Drafter):
    """One sequence's DFlash drafter: on a context of its own, or (``group``) on sequence ``seq`` of a shared one."""

    name = "dflash"
    cost_grows_with_length = False

    def __init__(self, model: Model, target: Model, target_ctx: Context, n_ctx: int, n_threads: int = 0, p_min: float = 0.0,
                 in_graph_argmax: bool | None = None, group: "DFlashGroup | None" = None, seq: int = 0, kv: str = "f16"):
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
        self.owner = group is None
        if group is None:
            self.ctx = dflash_context(model, target_ctx, n_ctx, n_threads, kv=kv)
            self.in_graph = greedy_in_graph(self.ctx, in_graph_argmax, self.top_k)
            self.ctx_limit = self.ctx.n_ctx - self.block_size
        else:  # its share of the group's context: positions 0..n_ctx-1 of sequence ``seq``
            self.ctx = SeqView(group.ctx, seq)
            self.in_graph = group.in_graph
            self.ctx_limit = min(n_ctx, self.ctx.n_ctx) - self.block_size
        target_ctx.capture_layer_inputs(self.layer_ids)
        self.n_injected = 0  # positions 0..n_injected-1 carry target features: in the cache, or the last n_held held
        self.n_held = 0
        self.held: np.ndarray | None = None  # [HOLD_ROWS, taps x width], made on first use
        self.asked = False  # drafted since its last intake: the next one goes straight in
        self._block = [self.mask] * self.block_size  # propose's draft batch (its first token set each time)

    def rollback(self, n_keep: int) -> None:
        if self.n_injected > n_keep:
            held_from = self.n_injected - self.n_held
            if n_keep <= held_from:
                self.n_held = 0
                self.ctx.seq_rm(n_keep)
            else:
                self.n_held = n_keep - held_from
            self.n_injected = n_keep

    def on_prompt(self, prompt: list[int]) -> None:
        """The prompt's held rows go in now (timed as prefill, in the decode that would otherwise open the first
        cycle's draft). A group's slot leaves them held: the group's next draft takes every slot's in one decode."""
        if self.owner and self.n_held:
            self.catch_up()

    def on_target_decode(self, target_ctx: Context, start_pos: int, n_committed: int) -> None:
        if self.asked and not self.n_held and start_pos == self.n_injected and start_pos + n_committed <= self.ctx_limit:
            # drafting every cycle: the rows go straight in (intake's first case, inline: it runs every cycle)
            self.asked = False
            self.n_injected = start_pos + n_committed
            self.ctx.decode_embd(self.features(target_ctx), start_pos, n_committed)
            return
        for parts, start, n in self.intake(target_ctx, start_pos, n_committed):
            self.ctx.decode_embd(parts, start, n)

    def intake(self, target_ctx, start_pos: int, n_committed: int) -> list[tuple[list, int, int]]:
        """What goes into the drafter's cache now of the rows committed at ``start_pos..``, as ``(arrays, start, n)``
        decodes in order (the held rows first); what does not is held (copied) until :meth:`release`."""
        # rows go in only right after the injected ones and within the drafter's context: past it (or after a gap)
        # they do not, so it drafts no more from there
        if start_pos != self.n_injected or start_pos + n_committed > self.ctx_limit:
            return []
        asked, self.asked = self.asked, False
        if asked or self.n_held + n_committed > HOLD_ROWS:
            out = (self.release() if self.n_held else []) + [(self.features(target_ctx), start_pos, n_committed)]
        else:
            out = []
            self.hold(self.features(target_ctx), n_committed)
        self.n_injected = start_pos + n_committed
        return out

    def hold(self, features, n: int) -> None:
        if type(features) is np.ndarray:  # [rows, taps, width]
            if self.held is None:
                self.held = np.empty((HOLD_ROWS, features.shape[1] * features.shape[2]), dtype=np.float32)
            self.held.reshape(HOLD_ROWS, *features.shape[1:])[self.n_held : self.n_held + n] = features[:n]
            self.n_held += n
            return
        if self.held is None:
            self.held = np.empty((HOLD_ROWS, sum(f.shape[1] for f in features)), dtype=np.float32)
        col = 0
        for f in features:
            self.held[self.n_held : self.n_held + n, col : col + f.shape[1]] = f[:n]
            col += f.shape[1]
        self.n_held += n

    def release(self) -> list[tuple[list, int, int]]:
        """The held rows as one decode (to run before anything else holds: the buffer is reused), now out of the hold."""
        if not self.n_held:
            return []
        n, self.n_held = self.n_held, 0
        return [([self.held], self.n_injected - n, n)]

    def catch_up(self) -> None:
        """Take the held rows in (before a draft)."""
        for parts, start, n in self.release():
            self.ctx.decode_embd(parts, start, n)

    def features(self, target_ctx):
        """Each tapped layer's rows of the target's last decode, side by side (a ``[rows, taps, width]`` view, else a list of
        ``[rows, width]`` views): they go straight into the drafter's batch, one copy."""
        rows = getattr(target_ctx, "layer_input_rows", None)  # (a stand-in such as tree.PathRows gives the list)
        return rows(self.layer_ids, target_ctx.n_last) if rows is not None else target_ctx.layer_inputs(self.layer_ids, target_ctx.n_last)

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        if k > self.max_draft:
            k = self.max_draft
        if k <= 0 or self.n_injected != n_past:
            return []
        if self.n_held:
            self.catch_up()
        self.asked = True
        # always draft the full block: the drafter was trained on it and its cost barely depends on k
        # (the block and outputs inline: self.block(history), self.outputs)
        block = self._block  # [last, MASK x (B-1)]: only its first token changes
        block[0] = history[-1]
        self.ctx.decode(block, n_past, "none" if self.top_k else "all")
        drafts = self.ctx.sampled_rows(1, k + 1) if self.in_graph else self.read(k)  # (read's in-graph case inline)
        self.ctx.seq_rm(n_past)
        return drafts

    def block(self, history: list[int]) -> list[int]:
        return [history[-1]] + [self.mask] * self.max_draft

    @property
    def outputs(self) -> str:
        return "none" if self.top_k else "all"  # DFlash2: the lattice (nextn rows), not logits

    def read(self, k: int) -> list[int]:
        """Up to ``k`` drafts from this drafter's block rows of the last draft decode."""
        if self.top_k:
            return walk_lattice(self.ctx.nextn_rows(self.block_size), self.top_k, k, self.p_min)
        if self.in_graph:
            return self.ctx.sampled_rows(1, k + 1)
        return self.ctx.all_logits()[1 : k + 1].argmax(axis=1).tolist()

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int) -> Tree:
        """DDTree: the block's per-position top candidates, grown best-first by cumulative drafter probability.

        DFlash1 positions are marginals given the anchor, so a node's children are its depth's candidates;
        DFlash2's selector scores each candidate given the one before it, so they depend on the node.
        """
        k = min(k, self.max_draft)
        if k <= 0 or self.n_injected != n_past or self.in_graph:  # in-graph argmax: no logits to branch on
            return Tree.chain(history[-1], self.propose(history, n_past, min(k, budget)))
        self.catch_up()
        self.asked = True
        block = self.block(history)
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
            ids, logp = ids.tolist(), logp.tolist()  # Python numbers: the walk reads one a node
            tree = best_first(history[-1], lambda depth, _: (ids[depth], logp[depth], None), budget, k)
        self.ctx.seq_rm(n_past)
        return tree

    def close(self) -> None:
        if self.owner:  # a group's slot drafter: the group closes the shared context and the model
            self.ctx.close()
            self.model.close()


class DFlashGroup(DrafterGroup):
    """Every slot's DFlash drafter on sequence i of one shared drafter context; each step phase is one decode.

    After a target step one decode takes in the committed rows' features of every slot that goes on
    drafting or whose hold is full (each on its own sequence, at its positions: :meth:`DFlashDrafter.intake`);
    a draft first takes in the drafting slots' held rows, all in one decode; a draft is one decode of every drafting slot's ``[last, MASK x (B-1)]``
    block, whose rows each slot reads, after which each noise block is cut from its sequence. The
    context holds ``n_ctx`` positions per slot, ``n_seq`` slots (:func:`dflash_context`).
    """

    shared_draft = True

    def __init__(self, model: Model, target: Model, target_ctx: Context, n_ctx: int, n_seq: int, n_threads: int = 0,
                 p_min: float = 0.0, in_graph_argmax: bool | None = None, kv: str = "f16", make=None):
        """``make``: the drafter of one slot (``dspark.dflash_drafter``: DSpark files get theirs); default DFlashDrafter."""
        make = make or DFlashDrafter
        self.model = model
        self.ctx = dflash_context(model, target_ctx, n_ctx, n_threads, n_seq, kv=kv)
        dspark = is_dspark(model)  # DSpark drafts are read from the Markov-corrected logits, never argmaxed in the graph
        self.in_graph = not dspark and greedy_in_graph(self.ctx, in_graph_argmax, model.dflash_selector_top_k(), n_seq)
        super().__init__([make(model, target, target_ctx, n_ctx, p_min=p_min, group=self, seq=i) for i in range(n_seq)])
        self.block_size = self.drafters[0].block_size
        self.per_decode = max(1, self.ctx.n_batch // self.block_size)  # blocks one draft decode carries

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in asks]
        top, drafters = self.drafters[0].max_draft, self.drafters
        go = [(j, drafters[i], history, n_past, k if k < top else top)
              for j, (i, history, n_past, k) in enumerate(asks)
              if k > 0 and top > 0 and drafters[i].n_injected == n_past]
        held = [(d.ctx, *item) for _j, d, _h, _n, _k in go for item in d.release()]
        if held:  # every drafting slot's held rows, in one decode before the drafts
            decode_embd_views(self.ctx, held)
        for _j, d, _h, _n, _k in go:
            d.asked = True
        for lo in range(0, len(go), self.per_decode):
            part = go[lo : lo + self.per_decode]
            decode_views(self.ctx, [(d.ctx, d.block(history), n_past, d.outputs) for _j, d, history, n_past, _k in part])
            for j, d, _history, n_past, k in part:
                out[j] = d.read(k)
                d.ctx.seq_rm(n_past)  # the noise block, from its own sequence
        return out

    @property
    def max_draft(self) -> int:
        return self.drafters[0].max_draft

    def on_target_decode(self, taken: list[Taken]) -> None:
        parts = [(self.drafters[i].ctx, *item) for i, view, start, n in taken for item in self.drafters[i].intake(view, start, n)]
        if parts:  # every slot's rows that go in now, in one decode (a slot's held rows before its new ones)
            decode_embd_views(self.ctx, parts)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
