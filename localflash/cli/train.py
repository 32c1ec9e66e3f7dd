"""``localflash train-drafter``: train a DFlash drafter for a target (:mod:`localflash.train`)."""

from __future__ import annotations

from typing import Optional

import typer

from localflash.cli.app import app


@app.command("train-drafter")
def train_drafter(
    target: str = typer.Option(..., "--target", "-m", help="Target GGUF the drafter will serve."),
    prompts: list[str] = typer.Option(..., "--prompts", help="Prompt file(s): JSONL (prompt/question/... or turns) or text."),
    out: str = typer.Option(..., "--out", "-o", help="Drafter GGUF to write."),
    work_dir: Optional[str] = typer.Option(None, "--work-dir", help="Data, checkpoints and report (default: the user cache)."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Let the target think while making the data."),
    max_prompts: int = typer.Option(0, "--max-prompts", help="Use only the first N prompts (0: all)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Longest target response."),
    holdout_every: int = typer.Option(40, "--holdout-every", help="Every N-th prompt is held out for the τ check."),
    layers: int = typer.Option(5, "--layers", help="Draft layers."),
    taps: int = typer.Option(5, "--taps", help="Target layers fused (spread like z-lab's)."),
    block_size: int = typer.Option(16, "--block-size", help="Block size B (drafts B-1 tokens per forward)."),
    draft_vocab: int = typer.Option(0, "--draft-vocab", help="Reduced draft vocabulary with its own head (0: the target's)."),
    sliding_window: int = typer.Option(0, "--sliding-window", help="Attend only the last W context positions in every layer (0: full)."),
    full_layers: int = typer.Option(0, "--full-layers", help="With --sliding-window: the last N layers attend the whole context, prompt included."),
    embedding_scale: float = typer.Option(0.0, "--embedding-scale", help="Scale the block's token embeddings (0: off)."),
    train_head: bool = typer.Option(False, "--train-head", help="Train the reduced-vocabulary head (needs --draft-vocab)."),
    mask_token: int = typer.Option(-1, "--mask-token", help="Mask token id (-1: the target's, else an unused control token)."),
    epochs: float = typer.Option(3.0, "--epochs"),
    steps: int = typer.Option(0, "--steps", help="Training steps (overrides --epochs)."),
    anchors: int = typer.Option(64, "--anchors", help="Random anchors (blocks) per sequence per step."),
    batch: int = typer.Option(4, "--batch", help="Sequences per step."),
    lr: float = typer.Option(6e-4, "--lr"),
    gamma: float = typer.Option(0.0, "--gamma", help="Loss decay γ over block slots (0: the paper's 7 for B=16, 5 for 10, 4 for 8; a one-layer drafter learns its first slots better with 1)."),
    seed: int = typer.Option(0, "--seed"),
    quant: str = typer.Option("Q8_0", "--quant", help="Q4_K_M | Q8_0 | F16 | F32."),
    hf_out: Optional[str] = typer.Option(None, "--hf-out", help="Also write an HF checkpoint to this folder."),
    workers: int = typer.Option(1, "--workers", help="Parallel processes generating the data."),
    threads: int = typer.Option(0, "--threads", "-t", help="llama.cpp threads per process (0: automatic)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda for training."),
    eval_tokens: int = typer.Option(128, "--eval-tokens", help="Tokens per held-out prompt in the τ check."),
    fresh: bool = typer.Option(False, "--fresh", help="Restart training (keeps the generated data)."),
):
    """Train a DFlash drafter for TARGET: its own responses and features, random anchors, weighted CE, GGUF export, τ."""
    from pathlib import Path

    from localflash.train.pipeline import PipelineConfig, run as run_pipeline
    from localflash.train.trainer import TrainConfig

    cfg = PipelineConfig(
        target=Path(target).expanduser(), prompts=[Path(p).expanduser() for p in prompts], out=Path(out).expanduser(),
        work_dir=Path(work_dir).expanduser() if work_dir else None, thinking=thinking, max_prompts=max_prompts,
        max_new_tokens=max_new_tokens, holdout_every=holdout_every, workers=workers, threads=threads, layers=layers,
        taps=taps, block_size=block_size, draft_vocab=draft_vocab, sliding_window=sliding_window, full_layers=full_layers, embedding_scale=embedding_scale, train_head=train_head, mask_token=mask_token, quant=quant,
        hf_out=Path(hf_out).expanduser() if hf_out else None, eval_tokens=eval_tokens, fresh=fresh,
        train=TrainConfig(anchors=anchors, batch=batch, epochs=epochs, steps=steps, lr=lr, gamma=gamma, seed=seed, device=device),
    )
    report = run_pipeline(cfg)
    typer.echo(report["drafter"])
