"""The draft–verify loop.

Each cycle: the drafter proposes up to k tokens; the target decodes
``[last] + draft`` in one pass; row i is sampled (greedy or seeded) and the
draft token i is kept only while it equals that sample; the first mismatch
is replaced by the target's own sample (the bonus token). The target's and
drafter's caches are then cut back to the committed positions. With k = 0
this is plain decoding, so both paths share every line that decides output.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from localflash.errors import LocalflashError
from localflash.llama import Context, Model
from localflash.speculative.adapt import DraftPolicy
from localflash.speculative.drafter import Drafter
from localflash.speculative.grammar import finish, trim_draft
from localflash.speculative.graph_sampler import GraphSampler, request_sampler
from localflash.speculative.prefill import PromptFill
from localflash.speculative.sampling import Sampler, SamplingParams
from localflash.speculative.stats import Stats


class Engine:
    """A target context plus an optional drafter; keeps the cache across requests.

    ``clock``: where every duration it records comes from (the draft policy's costs, Stats' times);
    ``time.perf_counter`` unless a caller measures costs its own way (tests inject a cost model).
    ``sample_in_graph``: the target's rows are sampled by llama.cpp's chain in the graph
    (``speculative/graph_sampler.py``; not with a tree, whose walk reads every node's logits).
    """

    clock = staticmethod(time.perf_counter)

    def __init__(self, target: Model, ctx: Context, drafter: Drafter | None = None, adaptive: bool = True, draft_max: int | None = None,
                 sample_in_graph: bool = False):
        self.target = target
        self.sample_in_graph = sample_in_graph
        self.ctx = ctx
        self.drafter = drafter or Drafter()
        max_draft = self.drafter.max_draft if draft_max is None else min(draft_max, self.drafter.max_draft)
        self.policy = DraftPolicy(max_draft, adaptive, self.drafter.cost_grows_with_length)
        self.tokens: list[int] = []  # committed tokens in the target cache, positions 0..len-1
        self.calibrated = False
        self.drafting = True  # switched off by /draft off or a phase policy
        self.tree = None  # a TreeVerifier (--tree): cycles verify a token tree instead of a chain

    def generate(self, prompt: list[int], max_tokens: int, sampling: SamplingParams | None = None, stats: Stats | None = None,
                 draft_max: int | None = None) -> Iterator[list[int]]:
        """Yield the new tokens of each cycle (accepted drafts first, then the target's own); fill ``stats`` as it goes.

        ``draft_max`` caps this request's draft length (0: plain decoding).
        """
        st = stats if stats is not None else Stats()
        st.drafter = self.drafter.name if self.policy.max_draft else "none"
        check_prompt(prompt, self.ctx.n_ctx)
        sample = request_sampler(self.ctx, sampling, self.sample_in_graph and self.tree is None)
        st.sampled_in = "graph" if isinstance(sample, GraphSampler) else "host"
        t0 = self.clock()
        counts0 = dict(self.ctx.counts)
        self._prefill(prompt, st)
        last = verify_block(self.ctx, [], sample, self.target.is_eog)[0]  # the prompt's last row
        st.t_prefill = self.clock() - t0
        st.prompt_tokens = len(prompt)
        history = list(prompt) + [last]
        t_start = self.clock()
        try:
            if self.target.is_eog(last):
                st.stop = "eog"
                return
            st.generated = 1
            yield [last]
            if not self.calibrated and self.policy.adaptive and self.policy.max_draft:
                t_cal = self.clock()
                self._calibrate()
                st.t_calibrate = self.clock() - t_cal  # a one-off cost of the engine's first request, not decode speed
                t_start += st.t_calibrate
            while st.generated < max_tokens:
                n_past = len(self.tokens)
                room = self.ctx.n_ctx - n_past - 1
                if room < 0:
                    st.stop = "context"
                    return
                limit = min(room, max_tokens - st.generated - 1, self.policy.max_draft if draft_max is None else draft_max)
                drafting = self.drafting and n_past + 1 + self.policy.max_draft <= self.drafter.ctx_limit
                k = self.policy.choose(limit) if drafting else 0
                if self.tree is not None and k:  # --tree: one pass over a token tree (speculative/tree.py)
                    new, tree, path, t_draft, t_verify = self.tree.cycle(self, history, last, n_past, k, sample)
                    depth = int(tree.depth.max())  # the policy's k is a tree's depth; its costs are the tree's
                    self.policy.record(depth, len(path) - 1, t_verify, t_draft)
                    st.record_cycle(tree.n - 1, len(path) - 1, len(new), depth=depth, leaves=tree.n_leaves)
                else:
                    new, t_draft, t_verify = self._chain_cycle(history, last, n_past, k, sample, st)
                st.t_target += t_verify
                st.t_draft += t_draft
                last = new[-1]
                history += new
                if self.target.is_eog(last):
                    new.pop()
                    st.stop = "eog"
                new = new[: max_tokens - st.generated]
                st.generated += len(new)
                if new:
                    yield new
                if st.stop:
                    return
            st.stop = "length"
        finally:
            st.t_decode = self.clock() - t_start
            st.rollback = self.ctx.rollback_path
            st.snapshot_rollbacks += self.ctx.counts["snapshot"] - counts0["snapshot"]
            st.checkpoint_restores += self.ctx.counts["restore"] - counts0["restore"]
            finish(sample, st)  # a grammar's counts and state
            # ``last`` is never in the cache: the next request re-decodes it if its prompt continues here

    def _chain_cycle(self, history: list[int], last: int, n_past: int, k: int, sample, st: Stats):
        """Draft up to ``k`` tokens, verify ``[last] + draft`` in one pass, commit; (new tokens, t_draft, t_verify)."""
        ctx, clock = self.ctx, self.clock
        td = clock()
        draft = trim_draft(sample, self.drafter.propose(history, n_past, k) if k else [])  # cut at a grammar's first reject
        tv = clock()  # one clock reading ends a phase and starts the next
        t_draft = tv - td
        n_draft = len(draft)
        if n_draft and ctx.recurrent and n_draft > ctx.n_rs_seq:
            ctx.checkpoint(transient=True)  # no snapshot reaches back (qwen3next): restore + replay on a miss
        ctx.decode([last] + draft, n_past, "all" if draft else "last")
        new = verify_block(ctx, draft, sample, self.target.is_eog)
        m = len(new) - 1  # drafts accepted
        self.tokens += [last] + draft[:m]
        if m < n_draft:
            self._cut(n_past + 1 + m)
        td2 = clock()
        t_verify = td2 - tv
        self.drafter.on_target_decode(ctx, n_past, m + 1)
        t_draft += clock() - td2
        self.policy.record(n_draft, m, t_verify, t_draft)
        st.record_cycle(n_draft, m, m + 1)
        return new, t_draft, t_verify

    def _prefill(self, prompt: list[int], st: Stats):
        """Decode the part of ``prompt`` not already cached; return the last row's logits (None: sampled in the graph)."""
        fill = PromptFill(self, prompt, st)
        while not fill.complete:
            self.ctx.decode(*fill.chunk(self.ctx.n_batch))
            fill.decoded()
        logits = None if self.sample_in_graph else self.ctx.logits(-1)
        self.drafter.on_prompt(prompt)
        return logits

    def _calibrate(self) -> None:
        """Time target passes of 1..max+1 tokens at the current position, then drop them."""
        n_past = len(self.tokens)
        top = max(self.policy.max_draft, self.tree.budget if self.tree else 0) + 1
        # a tree's sizes too, and 9 beside 8: CUDA's quantized mat-vec kernel batches up to 8 rows
        sizes = sorted({1, 2, 3, 4, 6, 8, 12, 16, top} | ({9, 24, 32, 48} if self.tree else set()))
        sizes = [s for s in sizes if s <= top and n_past + s < self.ctx.n_ctx]
        filler = self.tokens[-1:] or [self.target.bos]
        self.ctx.checkpoint(transient=True)  # recurrent memory: dropping a whole decode needs a restore
        for size in sizes:
            best = float("inf")
            for _ in range(2):
                t = self.clock()
                self.ctx.decode(filler * size, n_past, "all")
                self.ctx.sampled(0) if self.ctx.samples_in_graph else self.ctx.logits(0)  # waits for the pass
                best = min(best, self.clock() - t)
                self._cut(n_past)
            self.policy.verify.add(size, best)
        self.calibrated = True

    def _cut(self, p: int) -> None:
        """Drop cache positions >= ``p``; decode again what a checkpoint restore took back."""
        n = self.ctx.rewind(p)
        for off in range(n, p, self.ctx.n_batch):
            self.ctx.decode(self.tokens[off : min(p, off + self.ctx.n_batch)], off, "none")

    def reset(self) -> None:
        """Forget the cached conversation."""
        self.ctx.seq_rm(0)
        self.drafter.rollback(0)
        self.tokens.clear()

    def close(self) -> None:
        self.drafter.close()
        self.ctx.close()


def check_prompt(prompt: list[int], n_ctx: int, holder: str = "the context", hint: str = "raise -c/--ctx or shorten the prompt") -> None:
    """Refuse an empty prompt, or one that leaves no room to generate in ``n_ctx`` positions."""
    if not prompt:
        raise LocalflashError("the prompt is empty")
    if len(prompt) >= n_ctx:
        raise LocalflashError(f"the prompt has {len(prompt)} tokens but {holder} holds {n_ctx}", hint=hint)


def verify_block(ctx: Context, draft: list[int], sample, is_eog) -> list[int]:
    """Sample each verified row; keep draft tokens while they equal the target's sample.

    Returns the committed tokens: the accepted drafts plus one token of the
    target's own (the bonus), or fewer if an end-of-generation token comes first.
    No draft: the last output row (a plain step, the prompt's last token). With a
    :class:`GraphSampler` the rows' tokens are the ids llama.cpp's chain drew in the
    graph, and the committed ones are accepted into it (its stream's next draws).
    """
    graph = isinstance(sample, GraphSampler)
    if graph and is_eog == ctx.model.is_eog:  # the ids alone: no Python call per row (graph_sampling.py)
        return ctx.verify_sampled(draft, sample.eog)
    rows = None if graph else ctx.all_logits() if draft else [ctx.logits(-1)]  # views: no row is copied
    new = []
    n = len(draft)
    if type(sample) is Sampler and sample.params.temperature <= 0.0:  # greedy on the host: the argmax inline
        for i in range(n + 1):  # row by row, stopping at the first mismatch: only τ rows are read
            tok = int(rows[i].argmax())
            new.append(tok)
            if i == n or tok != draft[i] or is_eog(tok):
                return new
    for i in range(n + 1):
        tok = (ctx.sampled(i) if draft else ctx.sampled(-1)) if graph else sample(rows[i])
        new.append(tok)
        if i == n or tok != draft[i] or is_eog(tok):
            break
    if graph:
        ctx.accept_sampled(new)
    return new
