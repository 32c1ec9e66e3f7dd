"""``localflash models``: the pairs of models.toml as a table, and ``models check NAME``."""

from __future__ import annotations

from typing import Optional

import typer

from localflash.cli.app import app, fail


models_app = typer.Typer(
    invoke_without_command=True, no_args_is_help=False,
    help="List the pairs of models.toml with file presence and size; `models check NAME` validates one.",
)
app.add_typer(models_app, name="models")


@models_app.callback()
def models(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the list as JSON."),
    paths: bool = typer.Option(False, "--paths", help="Show full file paths."),
    vram: Optional[str] = typer.Option(None, "--vram", help="Say what fits one card of this size (e.g. 24GiB) instead of the detected ones."),
):
    """List the pairs of models.toml (shipped + user file) with file presence and size."""
    if ctx.invoked_subcommand is not None:
        return
    import json
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from localflash.bench.rig import cpu_name
    from localflash.bench.verdicts import all_verdicts, pair_key
    from localflash.registry.check import list_rows
    from localflash.registry.pairs import config_dir, load_pairs
    from localflash.plan.devices import fmt_bytes

    from localflash.plan.devices import detect, select_gpus
    from localflash.registry.check import fits

    pairs = load_pairs()
    rows = list_rows(pairs)
    gpus = select_gpus(detect(), vram=vram) if vram else detect()
    for r in rows:
        r["fit"] = fits(r, gpus)
    cpu = cpu_name()
    verdicts = {}
    for v in sorted(all_verdicts(), key=lambda v: v.get("date", "")):
        if v.get("rig_info", {}).get("cpu") == cpu:
            verdicts[v.get("pair_key")] = v
    for r, p in zip(rows, pairs.values()):
        v = verdicts.get(pair_key(p.target, p.drafter))
        r["verdict"] = v["text"] if v else None
    if json_out:
        typer.echo(json.dumps(rows, indent=1))
        return
    console = Console(highlight=False)

    def cell(f: dict, derive: str | None) -> Text:
        if f["path"] is None:
            return Text("-", style="dim")
        name = f["path"] if paths else Path(f["path"]).name
        if f.get("hf") and not paths:
            name = f["hf"]
        if f["exists"]:
            return Text.assemble(name, "\n", ("✓ ", "green"), (fmt_bytes(f["size"]), "dim"))
        if derive:
            return Text.assemble(name, "\n", ("○ ", "yellow"), (f"made from the target ({derive}) on first use", "dim"))
        if f.get("hf"):
            size = f" ~{fmt_bytes(f['listed_size'])}" if f.get("listed_size") else ""
            return Text.assemble(name, "\n", ("↓ on the hub", "cyan"), (f"{size}, not downloaded (`localflash pull`)", "dim"))
        return Text.assemble(name, "\n", ("✗ missing", "red"))

    def fit(f: dict) -> Text:
        mark = {True: ("fits", "green"), False: ("does not fit", "red"), None: ("?", "dim")}[f["fits"]]
        return Text.assemble(mark, "\n", (f["how"], "dim"))

    t = Table(header_style="bold")
    for col in ("pair", "kind", "target", "drafter", "ctx", "draft", "fits " + ("+".join(g.label for g in gpus) or "(no GPU)")):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["kind"], cell(r["target_file"], None), cell(r["drafter_file"], r["derive"]), str(r["ctx"]),
                  str(r["draft_max"]), fit(r["fit"]))
    console.print(t)
    for r in rows:
        if r["notes"] or r["verdict"]:
            console.print(Text.assemble((f"{r['name']}: ", "bold"), r["notes"], (f" · bench here: {r['verdict']}" if r["verdict"] else "", "green"),
                                        (f" · run here: {r['tested']}" if r["tested"] else "", "dim")))
    user = config_dir() / "models.toml"
    console.print(f"[dim]user pairs: {user}{'' if user.exists() else ' (none yet)'}; validate one with `localflash models check NAME`[/]")


@models_app.command("check")
def models_check(
    name: str = typer.Argument(..., help="A pair name from `localflash models`."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    rpc: Optional[str] = typer.Option(None, "--rpc", help="Also check these rpc-servers answer: HOST:PORT[,HOST:PORT...]."),
):
    """Load a pair's metadata and validate it: files, arch, vocabulary, layer ids, fused width (and --rpc servers)."""
    import json

    from rich.console import Console
    from rich.text import Text

    from localflash.registry.check import check_pair
    from localflash.registry.pairs import get_pair
    from localflash.cli.render import check_table

    p = get_pair(name)
    rows, ok = check_pair(p)
    if rpc:
        from localflash.plan.remote import parse_endpoints, rpc_check_rows

        rpc_rows, rpc_hints = rpc_check_rows(parse_endpoints(rpc))
        rows, ok = rows + rpc_rows, ok and all(g for _, g, _ in rpc_rows)
    if json_out:
        typer.echo(json.dumps({"pair": name, "ok": ok, "checks": [{"what": w, "ok": g, "detail": d} for w, g, d in rows]}, indent=1))
    else:
        console = Console(highlight=False)
        console.print(check_table(rows))
        console.print(Text(f"{name}: ok" if ok else f"{name}: not usable as configured", style="bold green" if ok else "bold red"))
    if not ok:
        what, bad = next((w, d) for w, g, d in rows if g is False)
        if rpc and what in rpc_hints:
            fail(bad, hint=rpc_hints[what])
        fail(f"pair {name!r} failed its check: {bad}", hint="fix the pair in models.toml (see `localflash models --paths`)")
