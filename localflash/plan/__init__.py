"""The memory planner: what a target, its drafter, KV cache and compute buffers cost on each device, and the fit.

Pure arithmetic over GGUF metadata (:mod:`localflash.formats.gguf_meta`) and detected devices; nothing is loaded.
"""

from localflash.plan.fit import Plan, Wishes, make_plan, runtime_kwargs

__all__ = ["Plan", "Wishes", "make_plan", "runtime_kwargs"]
