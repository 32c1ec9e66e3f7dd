"""The terminal report of ``localflash bench``: the speed table, drafting histograms, energy and the verdict."""

from __future__ import annotations

from localflash.archs import SYNTHETIC
from localflash.api import Stats


def table_rows(report: dict) -> list[dict]:
    rows = []
    cats = report["prompts"]["categories"]
    scopes = [(c, c) for c in cats] + ([("all", None)] if len(cats) > 1 else [])
    for label, scope in scopes:
        for m in report["modes"]:
            r = report["results"][m]["all"] if scope is None else report["results"][m]["categories"][scope]
            rows.append({"category": label, "mode": m, **r})
    return rows


def print_report(report: dict, console) -> None:
    from rich.text import Text

    from localflash.cli.render import bench_table, drafting_hist, energy_table, histogram
    from localflash.plan.devices import fmt_bytes

    energy = report.get("energy") or {}
    console.print(
        Text.assemble(
            ("bench ", "bold"), f"{report['pair']['name']} on {report['rig']['name']} · ",
            f"{report['prompts']['set']}: {report['prompts']['n']} prompts × {len(report['modes'])} modes, ",
            f"{report['settings']['max_tokens']} tokens each, temp {report['settings']['temperature']:g}",
            f", best of {report['settings']['repeat']}" if report["settings"]["repeat"] > 1 else "",
        )
    )
    if report["prompts"]["skipped"]:
        console.print(f"[yellow]skipped {report['prompts']['skipped']} prompts longer than the context ({report['settings']['ctx']})[/]")
    console.print(bench_table(table_rows(report)))
    for m in report["modes"]:
        if m == "none":
            continue
        allr = report["results"][m]["all"]
        s = Stats(cycles=allr["cycles"], accept_hist=list(allr["accept_hist"]), pos_tries=list(allr["pos_tries"]))
        hist, plain = drafting_hist(s)
        note = f" ({plain} of {allr['cycles']} cycles drafted nothing)" if plain else ""
        console.print(Text.assemble((f"{m}", "bold"), f": drafts accepted per cycle{note}"))
        if hist:
            console.print(histogram(hist))
        if allr.get("tree_cycles"):
            depths = " ".join(f"{100 * a:.0f}%" for a in allr["position_acceptance"])
            console.print(f"  trees of {allr['mean_tree_nodes']:.1f} drafted tokens in {allr['tree_cycles']}/{allr['cycles']} cycles; "
                          f"τ {allr['tau']:.2f}, {allr['tau_per_row']:.3f} per verified row; acceptance by depth: {depths}")
    rss = report.get("peak_rss_bytes")
    console.print(f"peak memory (RSS, all modes loaded): {fmt_bytes(rss) if rss else 'unknown'}")
    if energy.get("watts"):
        price = energy.get("price_per_kwh") is not None
        console.print(
            f"energy per million tokens at {energy['watts']:g} W"
            + (f" and {energy['price_per_kwh']:g} per kWh" if price else "")
            + " (the same draw assumed for every mode):"
        )
        console.print(energy_table([{"mode": m, **report["results"][m]["all"]} for m in report["modes"]], price))
    if any(m.startswith(SYNTHETIC) for m in report["modes"]):
        console.print("[dim]synthetic@α: benchmark only — an oracle drafter that proposes plain decoding's own tokens, "
                      "each right with probability α; the target verifies as usual (not in the verdict)[/]")
    v = report["verdict"]
    style = "green" if v["speculation_pays"] else "yellow"
    console.print(Text.assemble(("verdict: ", "bold"), (v["text"], style)))
