"""Rich tables, bars and histograms shared by ``chat``, ``bench`` and ``models``."""

from __future__ import annotations

from collections.abc import Iterable

from rich import box
from rich.table import Table
from rich.text import Text

from localflash.api import Stats

BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar of ``width`` cells with eighth-cell resolution."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    s = "█" * full + (BLOCKS[part] if part else "")
    return s.ljust(width)


def drafting_hist(stats: Stats) -> tuple[list[int], int]:
    """Cycles by drafts accepted, over cycles that drafted; and the cycles that drafted nothing.

    ``Stats.accept_hist[0]`` also counts plain cycles (k = 0); ``pos_tries[0]`` is
    the number of cycles that offered at least one draft token.
    """
    hist = list(stats.accept_hist)
    drafting = stats.pos_tries[0] if stats.pos_tries else 0
    plain = stats.cycles - drafting
    if hist:
        hist[0] -= plain
    while hist and hist[-1] == 0:
        hist.pop()
    return hist, plain


def histogram(counts: list[int], width: int = 30, label: str = "accepted") -> Table:
    """One row per bucket: ``label m``, a bar, the count and its share."""
    t = Table(show_header=True, box=None, pad_edge=False, header_style="bold")
    t.add_column(label, justify="right")
    t.add_column("", no_wrap=True)
    t.add_column("cycles", justify="right")
    t.add_column("share", justify="right")
    total = sum(counts)
    top = max(counts) if counts else 0
    for m, c in enumerate(counts):
        share = c / total if total else 0.0
        t.add_row(str(m), Text(bar(c / top if top else 0.0, width), style="cyan"), str(c), f"{100 * share:.0f}%")
    return t


def position_table(stats: Stats, width: int = 20) -> Table:
    """Acceptance at each draft position (given the earlier ones were accepted)."""
    t = Table(show_header=True, box=None, pad_edge=False, header_style="bold")
    t.add_column("pos", justify="right")
    t.add_column("accepted", justify="right")
    t.add_column("", no_wrap=True)
    t.add_column("hits/tries", justify="right")
    hits = stats.pos_hits + [0] * (len(stats.pos_tries) - len(stats.pos_hits))
    for j, (h, n) in enumerate(zip(hits, stats.pos_tries)):
        rate = h / n if n else 0.0
        t.add_row(str(j + 1), f"{100 * rate:.0f}%", Text(bar(rate, width), style="green"), f"{h}/{n}")
    return t


def stats_table(rows: dict[str, Stats], title: str | None = None) -> Table:
    """One row per named Stats: tokens, tok/s, τ, acceptance, drafted/accepted, time split."""
    t = Table(title=title, header_style="bold", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("")
    t.add_column("tokens", justify="right")
    t.add_column("tok/s", justify="right")
    t.add_column("τ", justify="right")
    t.add_column("accept", justify="right")
    t.add_column("acc/drafted", justify="right")
    t.add_column("time: target/draft/host", justify="right")
    for name, s in rows.items():
        total = s.t_decode or 1e-9
        split = f"{100 * s.t_target / total:.0f}/{100 * s.t_draft / total:.0f}/{100 * s.t_host / total:.0f}%"
        t.add_row(
            name,
            str(s.generated),
            f"{s.decode_tps:.1f}",
            f"{s.tau:.2f}",
            f"{100 * s.acceptance:.0f}%" if s.drafted else "-",
            f"{s.accepted}/{s.drafted}",
            split if s.t_decode else "-",
        )
    return t


def bench_table(rows: Iterable[dict]) -> Table:
    """The bench summary: one row per (category, mode)."""
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("category", overflow="fold")
    t.add_column("mode", no_wrap=True)
    t.add_column("n", justify="right")
    t.add_column("tok/s", justify="right")
    t.add_column("speedup", justify="right")
    t.add_column("τ", justify="right")
    t.add_column("accept", justify="right")
    t.add_column("same", justify="right")
    last_cat = None
    for r in rows:
        cat = r["category"]
        if last_cat is not None and cat != last_cat:
            t.add_section()
        sp = r["speedup"]
        sp_style = "green" if sp >= 1.05 else ("red" if sp < 0.97 else "")
        t.add_row(
            cat if cat != last_cat else "",
            r["mode"],
            str(r["prompts"]),
            f"{r['tok_s']:.1f}",
            Text(f"{sp:.2f}×", style=sp_style),
            f"{r['tau']:.2f}" if r["mode"] != "none" else "-",
            f"{100 * r['acceptance']:.0f}%" if r["drafted"] else "-",
            f"{r['same_as_plain']}/{r['prompts']}" if r["mode"] != "none" else "-",
        )
        last_cat = cat
    return t


def energy_table(rows: Iterable[dict], price: bool) -> Table:
    """Energy (and cost) per million generated tokens, one row per mode."""
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("mode")
    t.add_column("tok/s", justify="right")
    t.add_column("kWh / Mtok", justify="right")
    if price:
        t.add_column("cost / Mtok", justify="right")
    for r in rows:
        cells = [r["mode"], f"{r['tok_s']:.1f}", f"{r['kwh_per_mtok']:.3f}"]
        if price:
            cells.append(f"{r['cost_per_mtok']:.3f}")
        t.add_row(*cells)
    return t


def check_table(rows: list[tuple[str, bool | None, str]]) -> Table:
    """``models check`` report: (what, ok/failed/info, detail)."""
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column("", no_wrap=True)
    t.add_column("", no_wrap=True)
    t.add_column("")
    for what, ok, detail in rows:
        mark = Text("·", style="dim") if ok is None else (Text("✓", style="green") if ok else Text("✗", style="bold red"))
        t.add_row(mark, what, detail)
    return t
