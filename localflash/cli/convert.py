"""``localflash convert-drafter``: a z-lab DFlash or an HF DSpark checkpoint to a quantized GGUF, or (DFlash) back."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from localflash.cli.app import app
from localflash.errors import LocalflashError


@app.command("convert-drafter")
def convert_drafter(
    src: str = typer.Argument(..., help="HF drafter folder (config.json + *.safetensors); a dflash GGUF with --to-hf."),
    out: str = typer.Argument(..., help="Output GGUF file (a folder with --to-hf)."),
    target: Optional[str] = typer.Option(None, "--target", "-m", help="Target GGUF: its tokenizer is copied, its shape checked."),
    quant: str = typer.Option("Q4_K_M", "--quant", help="Q4_K_M | Q8_0 | F16 | F32."),
    to_hf: bool = typer.Option(False, "--to-hf", help="Reverse: a dflash GGUF to an HF checkpoint (for vLLM/SGLang)."),
    dtype: str = typer.Option("bf16", "--dtype", help="HF weight type with --to-hf: bf16 | f16 | f32."),
):
    """Convert a DFlash or DSpark drafter (HF checkpoint) to a quantized GGUF for llama.cpp, or (DFlash) back with --to-hf."""
    convert_command(src, out, target, quant, to_hf, dtype)


def convert_command(src: str, out: str, target: str | None, quant: str, to_hf: bool, dtype: str) -> Path:
    """``localflash convert-drafter``: progress on stderr, the written path on stdout."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from localflash.formats.dflash_gguf import DSparkSpec, check_against_target, read_dflash_gguf, read_target
    from localflash.formats.dflash_hf import gguf_to_hf
    from localflash.formats.dspark_hf import checkpoint_info, hf_to_gguf

    con = Console(stderr=True)
    if to_hf:
        src_p = Path(src).expanduser()
        if src_p.is_dir():
            raise LocalflashError(f"--to-hf reads a dflash GGUF file, but {src_p} is a folder")
        if target:
            info, _ = read_dflash_gguf(src_p)
            check_against_target(info, read_target(target))
        with con.status("reading GGUF") as status:
            dest = gguf_to_hf(src_p, out, dtype, on_stage=status.update)
        con.print(f"wrote {dest}/config.json and model.safetensors ({dtype})")
        print(dest)
        return dest
    if not target:
        raise LocalflashError("--target is required", hint="the drafter's target GGUF: its tokenizer is copied and its shape checked")
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), console=con, transient=True) as prog:
        task = prog.add_task("tensors", total=None)

        def on_tensor(name: str, k: int, total: int) -> None:
            prog.update(task, total=total, completed=k + 1, description=f"tensors ({name})")

        def on_stage(msg: str) -> None:
            prog.update(task, description=msg)

        dest = hf_to_gguf(src, out, target, quant, on_tensor=on_tensor, on_stage=on_stage)
    s = checkpoint_info(src).spec
    dspark = (f", DSpark Markov rank {s.markov_rank}, {'a' if s.confidence else 'no'} confidence head, "
              f"{'anchor-first' if s.sample_from_anchor else 'bonus-anchor'} block") if isinstance(s, DSparkSpec) else ""
    con.print(f"wrote {dest} ({dest.stat().st_size / 1e6:.1f} MB, {quant.upper()}): {s.n_layer} layers, block {s.block_size}, "
              f"mask token {s.mask_token_id}, taps {[i - 1 for i in s.target_layers]} -> layer inputs {s.target_layers}"
              + (f", sliding window {s.swa_window}" if s.swa_window else "") + dspark)
    if s.swa_window and s.causal is None:
        con.print("[yellow]note[/]: llama.cpp runs every layer bidirectionally inside the block; this checkpoint's sliding "
                  "layers were trained causal there, so acceptance may be a little lower than in vLLM/SGLang")
    print(dest)
    return dest
