"""A prompt's prefill, chunk by chunk: what the one-stream loop does in one call and a slot pool spreads over its steps.

:class:`PromptFill` holds the schedule and the bookkeeping; who decodes each chunk is the caller's
choice. :meth:`~localflash.speculative.loop.Engine._prefill` decodes chunks of ``n_batch`` back to
back; :class:`~localflash.speculative.slots.SlotPool` adds a joining request's next chunk to the
step's one ``llama_decode`` (continuous batching), so the other slots keep decoding while it fills.

Either way the prompt goes in as the loop has always put it: the part already cached is kept
(the common prefix, as far back as the cache can cut: a recurrent target resumes at its newest
checkpoint), the drafter sees each chunk (``on_target_decode``: DFlash reads its layer features
there), and on a recurrent target the chunks end right before the prompt's last token, where a
checkpoint of the state is kept for a later prompt that repeats or continues this one; the last
token is then a chunk of its own (its row is the one output).

:class:`JoiningPrompts` is the slot pool's side of it: which chunks ride in a step, and a joined prompt's first token.
"""

from __future__ import annotations

from localflash.llama.sequences import decode_views
from localflash.speculative.graph_sampler import GraphSampler

PREFILL_MIN_ROWS = 16  # a joining prompt's chunk in a step with decoding slots is never smaller (it always gets on)


def prefill_rows(costs, step_rows: int, decoding: bool, n_ubatch: int, n_batch: int) -> int:
    """How many prompt rows (all joining prompts together) a slot pool's step of ``step_rows`` decoding rows takes.

    No slot decoding (``decoding`` False): ``n_batch``, as a one-slot engine fills (nothing waits).
    Otherwise as many as cost about what the step's own rows cost, so a step that carries a prompt
    takes at most about twice as long: the step's cost over the per-row slope of the measured step
    costs (``costs``: StepPolicy's CostTable by rows, from calibration and past steps). On a CPU a
    row costs about the same in any batch, so that is about the step's own rows plus its fixed cost
    in rows; on a GPU a row is nearly free and the cap decides: the rows left in one micro-batch
    (``n_ubatch``). Never fewer than PREFILL_MIN_ROWS (a prompt always gets on), nor past ``n_batch``.
    """
    room = n_batch - step_rows
    if not decoding:
        return room
    step_rows = max(step_rows, 1)
    cap = max(PREFILL_MIN_ROWS, n_ubatch - step_rows)
    sizes = sorted(costs.ema)
    rows = cap
    if len(sizes) >= 2 and sizes[-1] > sizes[0]:
        slope = (costs.ema[sizes[-1]] - costs.ema[sizes[0]]) / (sizes[-1] - sizes[0])
        own = costs(step_rows)
        if slope > 0 and own:
            rows = min(cap, int(own / slope))
    return max(0, min(room, max(PREFILL_MIN_ROWS, rows)))


class PromptFill:
    """``prompt`` going into ``engine``'s cache (an Engine: its ``ctx``, ``tokens`` and ``drafter``).

    Making one cuts the cache back to the part it reuses (``st.cached_tokens``). Then, until
    :attr:`complete`: :meth:`chunk` names the next tokens to decode, the caller decodes them on
    ``engine.ctx`` (outputs ``last`` on the final chunk, else ``none``), and :meth:`decoded` records them.
    """

    def __init__(self, engine, prompt: list[int], st):
        self.engine = engine
        self.prompt = prompt
        keep = _common_prefix(engine.tokens, prompt)
        if keep == len(prompt):
            keep -= 1  # at least one token must be decoded to get fresh logits
        keep = st.cached_tokens = engine.ctx.rewind(keep)  # recurrent memory may resume earlier: its newest valid checkpoint
        engine.drafter.rollback(keep)
        del engine.tokens[keep:]
        self.done = keep  # prompt tokens in the cache
        # recurrent memory: save the state before the prompt's last token, where a later prompt that
        # repeats this one or continues it (the next chat turn) can resume
        self.split = len(prompt) - 1 if engine.ctx.recurrent and keep < len(prompt) - 1 else len(prompt)
        self._pending = 0

    @property
    def complete(self) -> bool:
        return self.done == len(self.prompt)

    def chunk(self, rows: int) -> tuple[list[int], int, str]:
        """The next at most ``rows`` tokens: (tokens, their first position, outputs); never across the split."""
        end = self.split if self.done < self.split else len(self.prompt)
        hi = min(end, self.done + max(1, rows))
        if end - hi == 1 and hi - self.done > 1:
            hi -= 1  # no one-row chunk left over before ``end``: one row would take another matmul kernel
        self._pending = hi - self.done
        return self.prompt[self.done : hi], self.done, "last" if hi == len(self.prompt) else "none"

    def decoded(self) -> None:
        """The last :meth:`chunk` is in the cache: the drafter sees it; at the split the state is checkpointed."""
        eng, off, n = self.engine, self.done, self._pending
        eng.tokens += self.prompt[off : off + n]
        self.done += n
        self._pending = 0
        eng.drafter.on_target_decode(eng.ctx, off, n)
        if self.done == self.split < len(self.prompt):
            eng.ctx.checkpoint()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class JoiningPrompts:
    """A :class:`~localflash.speculative.slots.SlotPool`'s joining prompts: each one's next chunk rides in a step's
    decode (within :func:`prefill_rows`), and its first token is sampled once the prompt is in."""

    def _fill_parts(self, filling: list, step_rows: int, step_outputs: int) -> list:
        """The next chunk of each joining prompt for this step's decode, within :func:`~localflash.speculative.prefill.prefill_rows`."""
        decoding = any(s.request is not None and s.request.state == "decode" for s in self.slots)  # (one whose reader is behind too)
        budget = prefill_rows(self.policy.verify, step_rows, decoding, self.n_ubatch, self.ctx.n_batch)
        outs = self.ctx.n_outputs_max - step_outputs
        parts = []
        for s in filling:
            if budget <= 0:
                continue
            tokens, start, outputs = s.request.fill.chunk(budget)
            if outputs == "last" and outs <= 0:  # no output row left in this decode: the prompt's last token waits a step
                continue
            outs -= outputs == "last"
            budget -= len(tokens)
            parts.append((s, (s.ctx, tokens, start, outputs)))
        return parts

    def _decode(self, parts: list) -> None:
        """One target decode of ``parts`` (a slot's rows each), counted: decodes and the slots they carried (/metrics)."""
        decode_views(self.ctx, parts)
        self.decodes += 1
        self.slot_decodes += len(parts)

    def _decode_with_fills(self, parts: list, filling: list) -> int:
        """One decode: the step's ``parts`` and the joining prompts' next chunks; returns the prompt rows it carried.

        The joining slots' bookkeeping runs right after it, before anything else decodes on the
        target (a prompt's last row is sampled from this decode's logits).
        """
        if not filling:  # (most steps: nothing joins)
            if parts:
                self._decode(parts)
            return 0
        step_rows = sum([len(p[1]) for p in parts])
        step_outputs = sum([len(p[1]) if p[3] in (True, "all") else 1 for p in parts])
        fills = self._fill_parts(filling, step_rows, step_outputs)
        if parts or fills:
            self._decode(parts + [f for _, f in fills])
        for s, _part in fills:
            self._filled(s)
        return sum([len(f[1]) for _, f in fills])

    def _fill_alone(self, filling: list) -> list:
        """Before a step's drafts: the next n_batch chunk of each joining prompt that goes alone (:meth:`_alone`),
        and its last token too when only that is left; returns the joining slots that ride in the step instead."""
        for s in [s for s in filling if self._alone(s)]:
            fill = s.request.fill
            self._decode([(s.ctx, *fill.chunk(self.ctx.n_batch))])
            self._filled(s)
            if s.request is not None and s.request.fill is fill and fill.done == fill.split == len(fill.prompt) - 1:
                self._decode([(s.ctx, *fill.chunk(1))])  # the checkpoint is taken: the last token, as a lone prefill
                self._filled(s)
        return [s for s in filling if not self._alone(s)]

    def _alone(self, s) -> bool:
        """Exact mode on a recurrent target: the joining prompt's chunks are the one-slot engine's (n_batch), each
        decoded by itself before a step's drafts (:meth:`_fill_alone`), so its micro-batches are a lone prefill's
        and its drafter takes it in where a lone prefill's does. In one decode with other sequences llama.cpp's
        equal split cuts them elsewhere, and a hybrid's exactness holds only for equal row counts (a one-row
        micro-batch takes vec_dot, not sgemm: engine.exact_options)."""
        return self.exact and s.ctx.recurrent

    def _filled(self, s) -> None:
        s.request.fill.decoded()
        if s.request.fill.complete:
            self._first_token(s)

    def _first_token(self, slot) -> None:
        """The joining prompt is in: sample and emit its first token; the request decodes from the next step."""
        req, st = slot.request, slot.request.stats
        if isinstance(req.sample, GraphSampler):  # the id the slot's chain drew (and committed to its stream)
            last = slot.ctx.verify_sampled([], req.sample.eog)[0]
        else:
            last = req.sample(slot.ctx.logits(-1))
        if not (self.policy.off and slot.drafter.lazy_prompt):  # drafting off: a draft model need not take the prompt in
            slot.drafter.on_prompt(req.prompt)
        req.fill = None
        st.t_prefill = self.clock() - req.t_fill
        st.prompt_tokens = len(req.prompt)
        req.history = req.prompt + [last]
        req.last = last
        req.t_start = self.clock()
        if self.target.is_eog(last):
            st.stop = "eog"
            self._finish(slot)
            return
        st.generated = 1
        req.emit("tokens", [last])
        if st.generated >= req.max_tokens:
            st.stop = "length"
            self._finish(slot)
            return
        req.state = "decode"
