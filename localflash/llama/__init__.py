"""The only package that imports llama_cpp. Everything else uses these wrappers."""

from localflash.llama.bindings import recent_log, set_verbose, verbose
from localflash.llama.sequences import SeqView, decode_views
from localflash.llama.runtime import (
    KV_TYPES,
    Batch,
    Context,
    ContextOptions,
    Model,
    ModelOptions,
    check_gguf,
    default_threads,
    gpu_offload_supported,
    use_exact_numerics,
)

__all__ = [
    "KV_TYPES",
    "Batch",
    "Context",
    "ContextOptions",
    "Model",
    "ModelOptions",
    "check_gguf",
    "default_threads",
    "gpu_offload_supported",
    "SeqView",
    "decode_views",
    "recent_log",
    "set_verbose",
    "verbose",
    "use_exact_numerics",
]
