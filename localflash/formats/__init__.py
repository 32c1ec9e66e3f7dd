"""File formats: GGUF metadata (read without weights), the DFlash drafter GGUF, HF checkpoints (safetensors)."""
