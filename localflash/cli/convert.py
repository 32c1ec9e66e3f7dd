"""``localflash convert-drafter``: a z-lab DFlash checkpoint to a quantized GGUF, or back."""

from __future__ import annotations

from typing import Optional

import typer

from localflash.cli.app import app


@app.command("convert-drafter")
def convert_drafter(
    src: str = typer.Argument(..., help="HF drafter folder (config.json + *.safetensors); a dflash GGUF with --to-hf."),
    out: str = typer.Argument(..., help="Output GGUF file (a folder with --to-hf)."),
    target: Optional[str] = typer.Option(None, "--target", "-m", help="Target GGUF: its tokenizer is copied, its shape checked."),
    quant: str = typer.Option("Q4_K_M", "--quant", help="Q4_K_M | Q8_0 | F16 | F32."),
    to_hf: bool = typer.Option(False, "--to-hf", help="Reverse: a dflash GGUF to an HF checkpoint (for vLLM/SGLang)."),
    dtype: str = typer.Option("bf16", "--dtype", help="HF weight type with --to-hf: bf16 | f16 | f32."),
):
    """Convert a DFlash drafter (z-lab HF checkpoint) to a quantized GGUF for llama.cpp, or back with --to-hf."""
    from localflash.formats.dflash_hf import convert_command

    convert_command(src, out, target, quant, to_hf, dtype)
