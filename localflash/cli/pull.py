"""``localflash pull PAIR|OWNER/REPO[:QUANT]``: download a pair (or one model) into huggingface_hub's cache."""

from __future__ import annotations

from typing import Optional

import typer

from localflash.cli.app import app
from localflash.errors import LocalflashError


@app.command("pull")
def pull(
    name: str = typer.Argument(..., help="A pair from `localflash models` named by hub files, or OWNER/REPO[:QUANT] (or OWNER/REPO/FILE.gguf)."),
    hf_drafter: Optional[str] = typer.Option(None, "-hfd", "--hf-drafter", help="Also this drafter: OWNER/REPO[:QUANT]."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
):
    """Download target and drafter (every part of a split GGUF) with one progress bar; resumes, checks sha256.

    Files land in huggingface_hub's cache (HF_HOME, HF_HUB_CACHE) and are reused from there by every
    tool; HF_TOKEN opens gated repos, HF_ENDPOINT names a mirror, HF_HUB_OFFLINE uses the cache only."""
    from rich.console import Console

    from localflash.hub import pull as hub_pull
    from localflash.registry.pairs import load_pairs

    out = Console(highlight=False)
    pairs = load_pairs()
    if name in pairs:
        p = pairs[name]
        if not p.target_hf and not p.drafter_hf:
            raise LocalflashError(f"pair {name!r} names no files on the hub", hint="its files are local: see `localflash models --paths`")
        target, drafter, pins = p.target_hf, hf_drafter or p.drafter_hf, p.sha256
    elif "/" in name:
        target, drafter, pins = name, hf_drafter, None
    else:
        raise LocalflashError(f"unknown pair {name!r}", hint=f"known pairs: {', '.join(sorted(pairs))}; or give OWNER/REPO[:QUANT]")
    t, d = hub_pull(target, drafter, quiet=quiet, pins=pins)
    for role, path in (("target", t), ("drafter", d)):
        if path is not None:
            out.print(f"{role}: {path}", soft_wrap=True)
    if name in pairs and not (pairs[name].drafter_hf or pairs[name].drafter is None) and pairs[name].drafter:
        out.print(f"[dim]drafter {pairs[name].drafter} is not on the hub: see the pair's notes (`localflash models`)[/]")
