"""``localflash chat``: a multi-turn terminal chat that shows what speculation is doing.

Replies stream with the model's own chat template; on a terminal a Rich Live
status line sits under the text (tok/s now and on average, τ, acceptance,
drafted/accepted, context fill, the drafter and its state). Stdin that is not
a terminal is read line by line: replies go to stdout, notices to stderr.

The conversation logic lives in :mod:`localflash.session` (the template,
prefix reuse of the cache, per-phase drafting, trimming the history in chunks
when the context is full); this module is the terminal on top of it: input,
commands, the status line, stats tables and transcripts.

Ctrl-C during a reply sets a flag that the session checks between draft–verify
cycles, so the engine always stops between cycles with a consistent cache; the
reply keeps what was streamed, and the next turn's prompt reuses the cached
prefix up to where the text differs. A second Ctrl-C stops at once and clears
the cache instead.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from localflash.api import PHASES, Stats
from localflash.cli.app import app, fail
from localflash.cli.chat_ui import LiveUI, PlainUI, StopFlag
from localflash.cli.options import MAX_TOKENS, SYSTEM, LoadFlags, SamplingFlags, shared_options, use
from localflash.errors import LocalflashError

HELP = [
    ("/reset", "forget the conversation (the system prompt stays)"),
    ("/system TEXT", "set the system prompt (no TEXT: show it)"),
    ("/stats", "session stats: per phase, acceptance per draft position, histogram"),
    ("/temp X", "sampling temperature (0 = greedy)"),
    ("/draft on|off|auto", "drafting always on, off, or per phase where it pays"),
    ("/think on|off", "the template's thinking switch (models that have one)"),
    ("/save FILE", "write the transcript as JSON"),
    ("/quit", "leave (Ctrl-D too)"),
]


@app.command()
@shared_options
def chat(
    load: LoadFlags = use(),
    draft: str = typer.Option("auto", "--draft", help="on | off | auto (per phase, where drafting pays)."),
    max_tokens: int = MAX_TOKENS.option(1024),
    sampling: SamplingFlags = use(temp=0.8, top_p=0.95, min_p=0.05),
    system: Optional[str] = SYSTEM.option(),
    think: Optional[bool] = typer.Option(None, "--think/--no-think", help="Thinking on/off (templates that have the switch)."),
    plain: bool = typer.Option(False, "--plain", help="No live status line, even on a terminal."),
):
    """Chat with a model: streamed replies, live tok/s and acceptance, slash commands (/help)."""
    from localflash.api import open_llm
    from localflash.bench.rig import rig_info
    from localflash.bench.verdicts import load_verdict, pair_key

    if draft not in ("on", "off", "auto"):
        fail(f"--draft must be on, off or auto, got {draft!r}")
    params = sampling.params()
    cfg = load.config()
    with open_llm(cfg) as llm:
        verdict = None
        if draft == "auto" and llm.info().draft_max:
            found = load_verdict(rig_info(cfg.n_gpu_layers)["name"], pair_key(cfg.target, cfg.drafter))
            verdict = (found or {}).get("modes", {}).get(llm.drafter)
        live = not plain and sys.stdin.isatty() and sys.stdout.isatty()
        session = ChatSession(
            llm, LiveUI() if live else PlainUI(), params, max_tokens=max_tokens, system=system,
            thinking=think, draft_mode=draft, verdict=verdict,
            info={"pair": cfg.pair, "target": str(cfg.target), "drafter": str(cfg.drafter) if cfg.drafter else None},
        )
        session.loop()


# -- the session ------------------------------------------------------------------

@dataclass
class Reply:
    text: str
    tokens: list[int]
    stats: Stats
    phases: dict[str, Stats]
    interrupted: bool
    prompt_tokens: int


class ChatSession:
    """A conversation in the terminal: the API's :class:`~localflash.session.Conversation` plus commands, streaming and stats."""

    def __init__(
        self,
        llm,
        ui,
        sampling,
        max_tokens: int = 1024,
        system: str | None = None,
        thinking: bool | None = None,
        draft_mode: str = "auto",
        verdict: dict | None = None,
        info: dict | None = None,
    ):
        self.llm = llm
        self.conv = llm.conversation(system=system, thinking=thinking, max_tokens=max_tokens, draft=draft_mode, verdict=verdict)
        self.ui = ui
        self.sampling = sampling
        self.requested_thinking = thinking
        self.info = info or {}
        self.verdict = verdict
        self.turn_no = 0
        self.total = Stats(drafter=llm.drafter)
        self.phase_total: dict[str, Stats] = {}
        self.last: Reply | None = None

    def _trim_notice(self, n_prompt: int) -> None:
        turns, dropped = self.conv.last_trim
        if turns:
            self.ui.notice(
                f"context full: dropped the {'oldest turn' if turns == 1 else f'oldest turns, {turns} of them'} ({dropped} tokens): "
                f"the prompt is now {n_prompt} of {self.conv.n_ctx}, so the next turns reuse the cache; the system prompt stays"
            )

    # -- a turn ------------------------------------------------------------------
    def turn(self, user: str) -> Reply | None:
        try:
            tokens, text = self.conv.build_prompt(user)
        except LocalflashError as e:
            self.ui.notice(f"error: {e.message}" + (f" ({e.hint})" if e.hint else ""), "bold red")
            return None
        self._trim_notice(len(tokens))
        self.turn_no += 1
        seed = None if self.sampling.seed is None else self.sampling.seed + self.turn_no
        recent: deque = deque()
        hard = False
        self.ui.start_reply()
        with StopFlag() as stop:
            gen = self.conv.start(tokens, text, sampling=replace(self.sampling, seed=seed), cancel=stop)
            try:
                for chunk in gen:
                    if chunk.text:
                        self.ui.push(chunk.text)
                    now = time.perf_counter()
                    recent.append((now, chunk.stats.generated))
                    while len(recent) > 2 and now - recent[0][0] > 1.0:
                        recent.popleft()
                    self.ui.status(self._status_line(chunk.stats, recent, gen.t_first, now, gen.tracker))
            except KeyboardInterrupt:
                hard = True
            finally:
                gen.close()
        tail = gen.unsent()
        if tail:
            self.ui.push(tail)
        interrupted = hard or stop.hit
        if hard:
            self.llm.reset()  # stopped mid-cycle: the cache may hold half a cycle
        st = gen.stats
        self.total.merge(st)
        for ph, s in gen.phases.items():
            self.phase_total.setdefault(ph, Stats(drafter=s.drafter)).merge(s)
        reply = Reply(gen.text, gen.tokens, st, gen.phases, interrupted, len(tokens))
        self.conv.add_turn(user, gen.text, self._reply_meta(reply))
        self.last = reply
        self.ui.end_reply(self._final_line(reply, gen.tracker))
        for msg in gen.notes:
            self.ui.notice(msg, "magenta")
        if interrupted:
            self.ui.notice(
                f"reply interrupted: kept the {st.generated} tokens shown"
                + ("; the cache was cleared and is rebuilt next turn" if hard else ""),
                "yellow",
            )
        elif st.stop == "context":
            self.ui.notice("reply stopped: the context is full (older turns are dropped next time)")
        elif st.stop == "length":
            self.ui.notice(f"reply stopped at --max-tokens {self.conv.max_tokens}", "dim")
        return reply

    # -- status lines -------------------------------------------------------------
    def _drafter_label(self) -> str:
        conv = self.conv
        if not conv.has_drafter:
            return "plain"
        name = self.llm.drafter
        if conv.draft_mode == "auto":
            return f"{name} auto:{'on' if conv.drafting else 'off'}"
        return f"{name} {conv.draft_mode}"

    def _status_line(self, st: Stats, recent, t_first, now, tracker) -> Text:
        span = recent[-1][0] - recent[0][0] if len(recent) > 1 else 0.0
        cur = (recent[-1][1] - recent[0][1]) / span if span > 0 else 0.0
        avg = (st.generated - 1) / (now - t_first) if t_first and now > t_first else 0.0
        n_ctx = self.conv.n_ctx
        used = self.conv.n_cached + 1
        parts = [
            (f"{cur:6.1f} tok/s", "bold green"),
            (f" · avg {avg:.1f}", ""),
        ]
        if self.conv.has_drafter:
            parts += [
                (f" · τ {st.tau:.2f}", "bold"),
                (f" · accept {100 * st.acceptance:.0f}%", ""),
                (f" ({st.accepted}/{st.drafted})", "dim"),
            ]
        parts += [
            (f" · ctx {used}/{n_ctx} ({100 * used / n_ctx:.0f}%)", ""),
            (f" · {self._drafter_label()}", "cyan"),
        ]
        if tracker.seen_think:
            parts.append((f" · {tracker.phase}", "magenta"))
        return Text.assemble(*parts)

    def _final_line(self, reply: Reply, tracker) -> Text:
        st = reply.stats
        n_ctx = self.conv.n_ctx
        used = self.conv.n_cached + 1
        parts = [
            f"{st.generated} tok · {st.decode_tps:.1f} tok/s (session {self.total.decode_tps:.1f})",
        ]
        if self.conv.has_drafter:
            parts.append(f" · τ {st.tau:.2f} · accept {100 * st.acceptance:.0f}% ({st.accepted}/{st.drafted})")
            if st.tree_cycles:
                parts.append(f" · tree {st.mean_tree_nodes:.1f} nodes")
        parts.append(f" · ctx {used}/{n_ctx} · {self._drafter_label()}")
        if len(reply.phases) > 1 or tracker.seen_think:
            parts.append(" · " + ", ".join(f"{ph} {s.decode_tps:.0f} tok/s τ {s.tau:.2f}" for ph, s in reply.phases.items()))
        return Text("".join(parts), style="dim")

    def _reply_meta(self, reply: Reply) -> dict:
        st = reply.stats
        return {
            "tokens": st.generated,
            "prompt_tokens": reply.prompt_tokens,
            "tok_s": st.decode_tps,
            "tau": st.tau,
            "acceptance": st.acceptance,
            "drafted": st.drafted,
            "accepted": st.accepted,
            "stop": "interrupted" if reply.interrupted else st.stop,
            "interrupted": reply.interrupted,
            "drafter": self._drafter_label(),
            "temperature": self.sampling.temperature,
            "phases": {ph: {"tokens": s.generated, "tok_s": s.decode_tps, "tau": s.tau, "acceptance": s.acceptance} for ph, s in reply.phases.items()},
        }

    # -- commands -------------------------------------------------------------------
    def handle(self, line: str) -> bool:
        """One input line (message or command); False when the session should end."""
        line = line.strip()
        if not line:
            return True
        if line.startswith("//"):
            self.turn(line[1:])
            return True
        if line.startswith("/"):
            return self.command(line)
        self.turn(line)
        return True

    def command(self, line: str) -> bool:
        name, _, arg = line.partition(" ")
        name, arg = name.lower(), arg.strip()
        ui = self.ui
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            from rich.table import Table

            t = Table(show_header=False, box=None, pad_edge=False)
            for c, d in HELP:
                t.add_row(Text(c, style="bold"), d)
            ui.info(t)
        elif name == "/reset":
            self.conv.clear()
            ui.notice("conversation cleared (system prompt and session stats kept)", "green")
        elif name == "/system":
            if not arg:
                ui.info(Text(f"system prompt: {self.conv.system!r}" if self.conv.system else "no system prompt (the template's default applies)"))
            else:
                self.conv.system = arg
                ui.notice(f"system prompt set ({len(arg)} characters)", "green")
        elif name == "/temp":
            try:
                value = float(arg)
                if not math.isfinite(value):
                    raise ValueError(arg)
                self.sampling = replace(self.sampling, temperature=value)  # validated by SamplingParams
            except ValueError:
                ui.notice(f"/temp needs a number, got {arg!r}", "bold red")
                return True
            except LocalflashError as e:
                ui.notice(e.message.replace("--temp", "/temp"), "bold red")
                return True
            ui.notice(f"temperature {value:g}" + (" (greedy)" if value == 0 else ""), "green")
        elif name == "/draft":
            if not arg:
                ui.info(Text(f"drafting: {self._drafter_label()}" + self._gate_summary()))
            elif arg not in ("on", "off", "auto"):
                ui.notice("/draft takes on, off or auto", "bold red")
            elif not self.conv.has_drafter:
                ui.notice("no drafter in this session (plain decoding); start with a pair or --drafter", "bold red")
            else:
                self.conv.set_draft_mode(arg)
                ui.notice(f"drafting {arg}" + (" (per phase, where it pays)" if arg == "auto" else ""), "green")
        elif name == "/think":
            if not self.conv.can_think:
                ui.notice("this model's chat template has no thinking switch", "bold red")
            elif not arg:
                ui.info(Text(f"thinking: {'template default' if self.conv.thinking is None else ('on' if self.conv.thinking else 'off')}"))
            elif arg not in ("on", "off"):
                ui.notice("/think takes on or off", "bold red")
            else:
                self.conv.thinking = arg == "on"
                ui.notice(f"thinking {arg}", "green")
        elif name == "/stats":
            self.show_stats()
        elif name == "/save":
            if not arg:
                ui.notice("/save needs a file name", "bold red")
            else:
                try:
                    path = self.save(Path(arg).expanduser())
                    ui.notice(f"saved {len(self.conv.messages)} messages to {path}", "green")
                except OSError as e:
                    ui.notice(f"could not save {arg}: {e.strerror or e}", "bold red")
        else:
            ui.notice(f"unknown command {name}; /help lists them (// sends a line that starts with /)", "bold red")
        return True

    def _gate_summary(self) -> str:
        gate = self.conv.gate
        if self.conv.draft_mode != "auto" or not gate.states:
            return ""
        return " · " + ", ".join(f"{ph} {'on' if s.on else 'off'}" for ph, s in gate.states.items())

    def show_stats(self) -> None:
        from rich.text import Text as T

        from localflash.cli.render import drafting_hist, histogram, position_table, stats_table

        ui = self.ui
        if not self.total.generated:
            ui.info(T("no replies yet"))
            return
        rows = {}
        if self.last is not None:
            rows["last reply"] = self.last.stats
        rows["session"] = self.total
        if self.phase_total and (len(self.phase_total) > 1 or "think" in self.phase_total):
            for ph in PHASES:
                if ph in self.phase_total:
                    rows[f"  {ph}"] = self.phase_total[ph]
        ui.info(stats_table(rows, title=f"stats · {self._drafter_label()}{self._gate_summary()}"))
        if not self.conv.has_drafter or not self.total.drafted:
            ui.info(T("no drafts yet: nothing to show per position", style="dim"))
            return
        if self.total.tree_cycles:
            ui.info(T(f"trees: {self.total.mean_tree_nodes:.1f} drafted tokens in {self.total.tree_cycles} of "
                      f"{self.total.cycles} passes; {self.total.tau_per_row:.3f} tokens per verified row; by depth below", style="bold"))
        ui.info(T("acceptance per draft position (given the earlier ones were accepted)", style="bold"))
        ui.info(position_table(self.total))
        hist, plain = drafting_hist(self.total)
        ui.info(T(f"drafts accepted per cycle ({plain} cycles drafted nothing)" if plain else "drafts accepted per cycle", style="bold"))
        ui.info(histogram(hist))

    def transcript(self) -> dict:
        conv = self.conv
        msgs = []
        if conv.system:
            msgs.append({"role": "system", "content": conv.system, "in_context": True})
        for i, m in enumerate(conv.messages):
            row = {"role": m["role"], "content": m["content"], "in_context": i >= conv.first}
            if "meta" in m:
                row["stats"] = m["meta"]
            msgs.append(row)
        return {
            "format": "localflash-chat-transcript",
            "version": 1,
            "saved": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **self.info,
            "settings": {
                "temperature": self.sampling.temperature,
                "top_k": self.sampling.top_k,
                "top_p": self.sampling.top_p,
                "min_p": self.sampling.min_p,
                "seed": self.sampling.seed,
                "max_tokens": conv.max_tokens,
                "ctx": conv.n_ctx,
                "draft": conv.draft_mode,
                "thinking": conv.thinking,
            },
            "system": conv.system,
            "dropped_turns": conv.dropped,
            "messages": msgs,
            "stats": {
                "session": _stats_dict(self.total),
                "phases": {ph: _stats_dict(s) for ph, s in self.phase_total.items()},
            },
        }

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(self.transcript(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    # -- the loop -------------------------------------------------------------------
    def header(self) -> None:
        ui = self.ui
        conv = self.conv
        bits = [f"{self.llm.info().target.name}", self._drafter_label()]
        bits.append(f"ctx {conv.n_ctx}")
        bits.append(f"temp {self.sampling.temperature:g}")
        if conv.can_think:
            bits.append("thinking " + ("default" if conv.thinking is None else ("on" if conv.thinking else "off")))
        ui.notice("localflash chat · " + " · ".join(bits) + " · /help", "bold")
        if conv.thinking is None and self.requested_thinking is not None:
            ui.notice("--think/--no-think ignored: this model's chat template has no thinking switch", "yellow")
        if self.verdict is not None:
            ui.notice(
                f"bench verdict on this rig: {self.llm.drafter} {self.verdict.get('speedup', 0):.2f}× plain"
                f" → drafting starts {'on' if conv.gate.start_on else 'off'}",
                "dim",
            )

    def loop(self) -> None:
        self.header()
        while True:
            line = self.ui.read()
            if line is None:
                break
            while line.endswith("\\"):  # a trailing backslash continues the message
                more = self.ui.read(continuation=True)
                if more is None:
                    break
                line = line[:-1] + "\n" + more
            try:
                if not self.handle(line):
                    break
            except KeyboardInterrupt:  # a Ctrl-C that landed outside a reply's stream
                messages = self.conv.messages
                if messages and messages[-1]["role"] == "user":
                    messages.pop()
                self.llm.reset()
                self.ui.notice("interrupted (the cache is rebuilt next turn)", "yellow")


def _stats_dict(s: Stats) -> dict:
    return {
        "tokens": s.generated,
        "tok_s": s.decode_tps,
        "tau": s.tau,
        "acceptance": s.acceptance,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "cycles": s.cycles,
        "position_acceptance": s.position_acceptance,
        "accept_hist": s.accept_hist,
        "rows": s.rows,
        "tree_cycles": s.tree_cycles,
        "mean_tree_nodes": s.mean_tree_nodes,
    }
