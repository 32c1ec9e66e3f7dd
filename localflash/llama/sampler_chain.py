"""llama.cpp's own sampler chain (top-k, top-p, min-p, temperature, dist), for measuring beside ours.

localflash samples on the host in :mod:`localflash.speculative.sampling`, or attaches
the same chain to the target context (:mod:`localflash.llama.graph_sampling`);
``benchmarks/speed/bench_sampling.py`` times this chain, on the host and attached to a
context as llama.cpp's backend sampling, on the same rows.
"""

from __future__ import annotations

from localflash.llama.bindings import lib
from localflash.llama.graph_sampling import chain_ptr
from localflash.llama.runtime import Context


class SamplerChain:
    """A ``llama_sampler`` chain in llama.cpp's default order; greedy when ``temperature`` is 0."""

    def __init__(self, temperature: float, top_k: int, top_p: float, min_p: float, seed: int = 0):
        self.ptr = chain_ptr(temperature, top_k, top_p, min_p, seed)
        self.attached: Context | None = None

    def sample(self, ctx: Context, row: int) -> int:
        """Sample output row ``row`` of ``ctx``'s last decode on the host (and accept it)."""
        return lib().llama_sampler_sample(self.ptr, ctx.ptr, row)

    def attach(self, ctx: Context) -> bool:
        """Run the chain inside ``ctx``'s graph (backend sampling); read tokens with ``ctx.sampled``.

        The context must be closed before this chain.
        """
        ok = bool(lib().llama_set_sampler(ctx.ptr, 0, self.ptr))
        self.attached = ctx if ok else None
        return ok

    def close(self) -> None:
        if self.attached is not None and self.attached.ptr is not None:
            raise RuntimeError("close the context this chain is attached to first")
        lib().llama_sampler_free(self.ptr)
        self.ptr = None
