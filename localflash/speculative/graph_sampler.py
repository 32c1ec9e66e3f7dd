"""The target's rows sampled inside llama.cpp's graph: only token ids cross to the host.

A request on an engine loaded with ``sample_in_graph`` gets a :class:`GraphSampler`
instead of the host :class:`~localflash.speculative.sampling.Sampler`: the target
context carries llama.cpp's own chain (greedy, or top-k → top-p → min-p → temperature →
a seeded ``dist``), every output row of a verify pass comes back as the id that chain
drew, ``verify_block`` keeps drafts while they equal those ids, and the committed tokens
are accepted into the chain, which advances its random stream one draw per committed
token (``localflash.llama.graph_sampling``: the transactional ``dist``). So:

- greedy: the same tokens as plain greedy decoding (the graph's argmax of the same rows);
- sampled: every token follows the target's filtered distribution, and a speculative run
  emits the same tokens as plain decoding with the same seed *on this path*.

Where the two paths' draws differ: localflash's host sampler draws its uniforms from
NumPy's PCG64 (``default_rng(seed)``) and finds the kept set in float64;
llama.cpp's ``dist`` draws from ``std::mt19937(seed)`` and filters and sums in float32
inside the graph (its top-k, a sort for top-p, a cumulative sum). Both sample the same
distribution, but the same seed gives different tokens on the two paths; each path is
identical between speculative and plain decoding. Trees (``--tree``) read every node's
logits and stay on the host path.

Parallel slots (:func:`slot_sampler`): each slot's sequence carries a chain of its own, made
from the request's settings when the request takes the slot (``SlotPool._admit``, on the pool's
thread, between steps) and reset or replaced when the next request comes; it stays attached while
the slot is idle (a next request with the same settings only resets it: no graph rebuild). Each
slot's rows are drawn from its own chain's stream, transactionally (a slot context has more than
one output row, so every decode draws from a copy and only committed tokens advance the stream):
a slot's output equals the same request decoded alone on this path with that seed, whatever the
other slots in its steps do. A constrained request (a grammar, tool calls) is sampled on the host,
per request: its slot's chain is detached while it runs, so its rows' logits reach the host
(llama.cpp then copies every output row of a micro-batch holding one of its rows, ``needs_raw_logits``:
the other slots' ids still come from their chains). Trees do not run on slots (``--tree`` with
``--parallel`` is refused at load).
"""

from __future__ import annotations

from localflash.errors import LocalflashError
from localflash.llama import Context
from localflash.speculative.grammar import ConstrainedSampler, host_sampler
from localflash.speculative.sampling import SamplingParams


class GraphSampler:
    """One request's sampling by the chain attached to the target context (see the module docstring)."""

    def __init__(self, ctx: Context, params: SamplingParams | None = None):
        self.params = p = params or SamplingParams()
        if not ctx.sample_in_graph(p.temperature, p.top_k, p.top_p, p.min_p, p.seed):
            raise LocalflashError("llama.cpp could not attach the sampler chain to the target context",
                                  hint="load with --sample-in-graph off")
        self.ctx = ctx
        self.eog = ctx.model.eog_ids  # the verify step's stop set (a set test per row, no call)

    def __call__(self, logits):
        raise LocalflashError("the target's rows are sampled in llama.cpp's graph: there are no logits to sample on the host")


def request_sampler(ctx: Context, params: SamplingParams | None, in_graph: bool):
    """The sampler of one request: a :class:`GraphSampler` (the chain attached or reset) or the host Sampler (detached).

    A request with a grammar is sampled on the host (its rows are masked there: speculative/grammar.py).
    """
    if in_graph and not (params is not None and params.grammar):
        return GraphSampler(ctx, params)
    ctx.sample_on_host()
    return host_sampler(ctx.model, params)


def slot_sampler(view, sample, in_graph: bool):
    """The sampler of a request taking a slot (sequence ``view`` of a slot pool's target), chosen on the pool's thread.

    ``sample``: the host sampler the request was made with. In the graph (``in_graph``): a :class:`GraphSampler` on the
    slot's own chain (attached, reset or replaced); a constrained request keeps its host sampler and the slot's chain is
    detached (see the module docstring). Off the graph: ``sample`` as it is.
    """
    if not in_graph:
        return sample
    if isinstance(sample, ConstrainedSampler):
        view.sample_on_host()
        return sample
    return GraphSampler(view, sample.params)
