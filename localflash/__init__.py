"""localflash: speculative decoding for quantized GGUF models on the GPUs people own."""

__version__ = "0.1.0"
