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
logits and stay on the host path; so do parallel slots (one chain per sequence is not wired).
"""

from __future__ import annotations

from localflash.errors import LocalflashError
from localflash.llama import Context
from localflash.speculative.grammar import host_sampler
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
