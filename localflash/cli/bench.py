"""``localflash bench``: plain vs speculative decoding on the same prompts, through :mod:`localflash.bench`."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from localflash.cli.app import app, fail
from localflash.cli.options import MAX_TOKENS, PARALLEL, RAW, LoadFlags, SamplingFlags, shared_options, use


@app.command()
@shared_options
def bench(
    load: LoadFlags = use(skip=("spec",)),
    modes: Optional[str] = typer.Option(None, "--modes", help="Comma list of none, ngram, draft, dflash, mtp, dflash+ngram, draft+ngram, mtp+ngram, or 'all' (default: plain + the pair's kind), each with an optional /treeN (dflash/tree15: trees of 15 drafted tokens); synthetic: a benchmark-only oracle drafter (see --synthetic-accept)."),
    prompts: str = typer.Option("spec_bench", "--prompts", help="spec_bench | humaneval | FILE.jsonl."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Prompts per category (0: all; default: 3 of each named set's categories, all of a FILE)."),
    max_tokens: int = MAX_TOKENS.option(128),
    repeat: int = typer.Option(1, "--repeat", help="Runs per prompt and mode; the fastest counts (rejects interference)."),
    sampling: SamplingFlags = use(),
    raw: bool = RAW.option(),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the full report as JSON to this file (- for stdout)."),
    watts: Optional[float] = typer.Option(None, "--watts", help="Power draw while decoding, for energy per million tokens."),
    price_kwh: Optional[float] = typer.Option(None, "--price-kwh", help="Electricity price per kWh (needs --watts)."),
    save: bool = typer.Option(True, "--save/--no-save", help="Save the verdict for this rig and pair (used by chat --draft auto)."),
    synthetic_accept: str = typer.Option("0.6,0.8,0.95", "--synthetic-accept", help="Acceptance rates of --modes synthetic (benchmark-only oracle drafter)."),
    parallel: int = PARALLEL.option(),
):
    """Plain vs speculative decoding on the same prompts, interleaved; table, histogram, verdict."""
    from dataclasses import replace

    from rich.console import Console

    from localflash.bench.prompts import PROMPT_SETS, load_prompts
    from localflash.bench.run import check_modes, run_bench
    from localflash.bench.verdicts import save_verdict
    from localflash.cli.bench_report import print_report

    if limit is None:
        limit = 3 if prompts in PROMPT_SETS else 0
    if limit < 0:
        fail(f"--limit must be 0 (all) or more, got {limit}")
    if not 1 <= repeat <= 100:
        fail(f"--repeat must be in 1..100, got {repeat}")
    if watts is not None and watts <= 0:
        fail(f"--watts must be positive, got {watts:g}")
    if price_kwh is not None and (watts is None or price_kwh < 0):
        fail("--price-kwh needs --watts and a price of 0 or more", hint="e.g. --watts 350 --price-kwh 0.30")
    params = sampling.params()
    cfg = load.config()
    if modes is None or modes.strip().lower() == "all":
        from localflash.api import drafter_kind

        kind = drafter_kind(cfg)
        wanted = [kind] if modes is None else ["ngram", kind]
    else:
        wanted = modes.split(",")
    mode_list = check_modes(wanted, cfg, synthetic_accept.split(","))
    set_name, plist = load_prompts(prompts, limit or None)
    to_stdout = json_out == "-"
    out = Console(stderr=to_stdout, highlight=False)
    err = Console(stderr=True)
    if parallel != 1:
        from localflash.bench.parallel import print_parallel_report, run_parallel_bench
        from localflash.config import check_parallel

        check_parallel(replace(cfg, parallel=parallel))
        plain_first = ["none"] + [m for m in mode_list if m != "none"]
        report = run_parallel_bench(cfg, plain_first, plist, max_tokens, params, parallel, raw=raw, console=err)
        print_parallel_report(report, out)
        if json_out:
            _write_json(report, json_out)
        return
    report = run_bench(
        cfg, mode_list, set_name, plist, max_tokens, params, raw=raw, ctx_given=load.ctx is not None,
        watts=watts, price=price_kwh, repeat=repeat, console=err,
    )
    print_report(report, out)
    if save and len(mode_list) > 1 and cfg.rpc:  # a verdict is per pair and rig; this one measured the link too
        out.print("[dim]verdict not saved: measured with --rpc servers[/]")
    elif save and len(mode_list) > 1:
        path = save_verdict(report["verdict"])
        out.print(f"[dim]verdict saved to {path}[/]")
    if json_out:
        _write_json(report, json_out)


def _write_json(report: dict, json_out: str) -> None:
    import json

    text = json.dumps(report, indent=1)
    if json_out == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(json_out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
