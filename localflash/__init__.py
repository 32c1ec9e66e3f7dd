"""localflash: speculative decoding for quantized GGUF models on the GPUs people own.

``from localflash import load`` is the Python API (see :mod:`localflash.api`);
it is imported on first use, so ``import localflash`` stays instant.
"""

__version__ = "0.1.0"

_API = {"load": "api", "open_llm": "api", "LLM": "api", "Chunk": "session", "Completion": "session", "ContextOverflow": "errors", "LocalflashError": "errors"}
__all__ = ["load", "LLM", "Chunk", "Completion", "ContextOverflow", "LocalflashError", "__version__"]


def __getattr__(name):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    raise AttributeError(f"module 'localflash' has no attribute {name!r}")
