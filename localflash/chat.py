"""``localflash chat``: a multi-turn terminal chat that shows what speculation is doing.

Replies stream with the model's own chat template; on a terminal a Rich Live
status line sits under the text (tok/s now and on average, τ, acceptance,
drafted/accepted, context fill, the drafter and its state). Stdin that is not
a terminal is read line by line: replies go to stdout, notices to stderr.

Ctrl-C during a reply sets a flag that the stream checks after every
draft–verify cycle, so the engine always stops between cycles with a
consistent cache; the reply keeps what was streamed, and the next turn's
prompt reuses the cached prefix up to where the text differs. A second
Ctrl-C stops at once and clears the cache instead.

Thinking models: text inside ``<think>…</think>`` is the *think* phase, the
rest the *answer* phase. Each phase has its own stats and its own draft-length
policy (the measured costs are shared); under ``/draft auto`` a :class:`PhaseGate`
turns drafting off in a phase where it decodes slower than plain decoding and
probes now and then to turn it back on.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .errors import LocalflashError
from .phases import PHASES, PhaseGate, PhaseTracker, diff_stats, initial_phase  # noqa: F401 (re-exported)
from .speculative.stats import Stats

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


# -- Ctrl-C ----------------------------------------------------------------------

class StopFlag:
    """While active, the first SIGINT only sets ``hit``; a second one raises KeyboardInterrupt."""

    def __init__(self):
        self.hit = False
        self._prev = None

    def _on_sigint(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self):
        self.hit = False
        if threading.current_thread() is threading.main_thread():
            self._prev = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc):
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
            self._prev = None
        return False


# -- output -------------------------------------------------------------------------

class PlainUI:
    """Non-terminal I/O: one input line per message, replies on stdout, the rest on stderr."""

    live = False

    def __init__(self, stdin=None, stdout=None, stderr=None):
        self.stdin = stdin or sys.stdin
        self.out = stdout or sys.stdout
        self.err = Console(file=stderr or sys.stderr, highlight=False, soft_wrap=True)
        self.info_console = Console(file=self.out, highlight=False)

    def read(self, continuation: bool = False) -> str | None:
        if self.stdin.isatty():  # --plain on a terminal: still say that input is wanted
            self.err.file.write("   … " if continuation else "you› ")
            self.err.file.flush()
        line = self.stdin.readline()
        return None if line == "" else line.rstrip("\n")

    def notice(self, text: str, style: str = "yellow") -> None:
        self.err.print(Text(text, style=style))

    def info(self, renderable) -> None:
        self.info_console.print(renderable)

    def start_reply(self) -> None:
        pass

    def push(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def status(self, line: Text) -> None:
        pass

    def end_reply(self, final: Text) -> None:
        self.out.write("\n")
        self.out.flush()
        self.err.print(final)


class LiveUI:
    """Terminal I/O: a Rich Live region holds the reply's unfinished line and the status line.

    Finished lines are printed above the region as they complete, so the
    region stays small however long the reply gets.
    """

    live = True

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self._live: Live | None = None
        self._line = ""
        self._status = Text("")
        try:  # line editing and history for input()
            import readline  # noqa: F401
        except ImportError:  # pragma: no cover - Windows
            pass

    def read(self, continuation: bool = False) -> str | None:
        prompt = Text("   … " if continuation else "you› ", style="bold cyan")
        while True:
            try:
                return self.console.input(prompt)
            except EOFError:
                self.console.print()
                return None
            except KeyboardInterrupt:
                self.console.print()
                self.notice("(Ctrl-D or /quit leaves; Ctrl-C stops a reply)", "dim")

    def notice(self, text: str, style: str = "yellow") -> None:
        (self._live.console if self._live else self.console).print(Text(text, style=style))

    def info(self, renderable) -> None:
        self.console.print(renderable)

    def _region(self):
        return Group(Text(self._line), self._status)

    def start_reply(self) -> None:
        self._line = ""
        self._status = Text("…", style="dim")
        self._live = Live(self._region(), console=self.console, refresh_per_second=8, transient=True)
        self._live.start()

    def push(self, text: str) -> None:
        buf = self._line + text
        lines = buf.split("\n")
        for done in lines[:-1]:
            self._live.console.print(Text(done), soft_wrap=True)
        rest = lines[-1]
        limit = max(40, self.console.width * max(4, self.console.height - 4))
        if len(rest) > limit:  # a very long line without breaks: print the wrapped part above
            cut = rest.rfind(" ", 0, limit)
            cut = cut if cut > 0 else limit
            self._live.console.print(Text(rest[:cut]), soft_wrap=True)
            rest = rest[cut:].lstrip(" ")
        self._line = rest
        self._live.update(self._region())

    def status(self, line: Text) -> None:
        self._status = line
        if self._live:
            self._live.update(self._region())

    def end_reply(self, final: Text) -> None:
        if self._live:
            self._live.stop()
            self._live = None
        if self._line:
            self.console.print(Text(self._line), soft_wrap=True)
        self._line = ""
        self.console.print(final)


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
    """A conversation on one Engine: history, template, commands, streaming and stats."""

    def __init__(
        self,
        engine,
        ui,
        sampling,
        max_tokens: int = 1024,
        system: str | None = None,
        thinking: bool | None = None,
        draft_mode: str = "auto",
        verdict: dict | None = None,
        info: dict | None = None,
    ):
        from .prompt import supports_thinking

        self.engine = engine
        self.model = engine.target
        self.ui = ui
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.system = system
        self.can_think = supports_thinking(self.model)
        self.thinking = thinking if self.can_think else None
        self.requested_thinking = thinking
        self.has_drafter = engine.policy.max_draft > 0
        self.info = info or {}
        self.messages: list[dict] = []  # every turn; messages[self.first:] are in the context
        self.first = 0
        self.dropped = 0
        self.turn_no = 0
        self.total = Stats(drafter=engine.drafter.name if self.has_drafter else "none")
        self.phase_total: dict[str, Stats] = {}
        self.last: Reply | None = None
        self.verdict = verdict
        start_on = True
        if verdict is not None:
            from .bench import apply_verdict

            start_on = apply_verdict(engine, verdict)
        self.gate = PhaseGate(start_on=start_on)
        self.draft_mode = draft_mode if self.has_drafter else "off"
        self.policies = {"answer": engine.policy}
        self._apply_draft_mode("answer")

    # -- prompt building -----------------------------------------------------
    def _render(self, messages: list[dict]) -> str:
        from .prompt import render_chat

        return render_chat(self.model, messages, add_generation_prompt=True, thinking=self.thinking)

    def _context_messages(self, user: str) -> list[dict]:
        sys_msg = [{"role": "system", "content": self.system}] if self.system else []
        turns = [{"role": m["role"], "content": m["content"]} for m in self.messages[self.first :]]
        return sys_msg + turns + [{"role": "user", "content": user}]

    def reserve(self) -> int:
        """Room kept free for the reply when deciding whether the history still fits."""
        return min(self.max_tokens, max(32, self.engine.ctx.n_ctx // 4))

    def build_prompt(self, user: str) -> tuple[list[int], str]:
        """Tokens of the next prompt; drops the oldest turns (never the system prompt) to fit."""
        from .prompt import tokenize_prompt

        n_ctx = self.engine.ctx.n_ctx
        dropped, dropped_tokens = 0, 0
        while True:
            text = self._render(self._context_messages(user))
            tokens = tokenize_prompt(self.model, text)
            if len(tokens) + self.reserve() <= n_ctx:
                break
            nxt = self._next_turn_start(self.first)
            if nxt is None:
                raise LocalflashError(
                    f"this message needs {len(tokens)} prompt tokens (+{self.reserve()} for the reply) "
                    f"but the context holds {n_ctx}",
                    hint="shorten it, shorten the system prompt, or restart with a larger -c/--ctx",
                )
            before = len(tokens)
            dropped += 1
            self.first = nxt
            dropped_tokens += before - len(tokenize_prompt(self.model, self._render(self._context_messages(user))))
        if dropped:
            self.dropped += dropped
            self.ui.notice(
                f"context full: dropped the {'oldest turn' if dropped == 1 else f'{dropped} oldest turns'} "
                f"({dropped_tokens} tokens) to fit {n_ctx}; the system prompt stays"
            )
        return tokens, text

    def _next_turn_start(self, i: int) -> int | None:
        """Index just past the turn that starts at ``i`` (None: no turn left to drop)."""
        if i >= len(self.messages):
            return None
        j = i + 1
        while j < len(self.messages) and self.messages[j]["role"] != "user":
            j += 1
        return j

    # -- drafting control ------------------------------------------------------
    def _policy_for(self, phase: str):
        if phase not in self.policies:
            from .speculative.adapt import DraftPolicy

            base = self.policies["answer"]
            p = DraftPolicy(base.max_draft, base.adaptive, base.draft_cost_grows)
            p.verify, p.draft = base.verify, base.draft  # costs belong to the machine, acceptance to the phase
            self.policies[phase] = p
        return self.policies[phase]

    def _apply_draft_mode(self, phase: str) -> None:
        if not self.has_drafter:
            self.engine.drafting = False
            return
        self.engine.policy = self._policy_for(phase)
        if self.draft_mode == "on":
            self.engine.drafting = True
        elif self.draft_mode == "off":
            self.engine.drafting = False
        else:
            self.engine.drafting = self.gate.wants(phase)

    # -- a turn ------------------------------------------------------------------
    def turn(self, user: str) -> Reply | None:
        from .prompt import TextStream
        from .speculative.sampling import SamplingParams

        try:
            tokens, text = self.build_prompt(user)
        except LocalflashError as e:
            self.ui.notice(f"error: {e.message}" + (f" ({e.hint})" if e.hint else ""), "bold red")
            return None
        self.turn_no += 1
        seed = None if self.sampling.seed is None else self.sampling.seed + self.turn_no
        sampling: SamplingParams = replace(self.sampling, seed=seed)
        tracker = PhaseTracker(initial_phase(text) if self.can_think else "answer")
        self._apply_draft_mode(tracker.phase)
        stream = TextStream(self.model)
        st = Stats()
        phases: dict[str, Stats] = {}
        pieces: list[str] = []
        emitted: list[int] = []
        gate_notes: list[str] = []
        recent: deque = deque()
        hard = False
        self.ui.start_reply()
        gen = self.engine.generate(tokens, self.max_tokens, sampling, st)
        t_first = None
        with StopFlag() as stop:
            try:
                prev, t_prev = copy.deepcopy(st), time.perf_counter()
                for new in gen:
                    now = time.perf_counter()
                    phase = tracker.phase
                    if t_first is None:
                        t_first = now
                    else:
                        cyc = diff_stats(st, prev, now - t_prev)
                        phases.setdefault(phase, Stats(drafter=st.drafter)).merge(cyc)
                        if self.draft_mode == "auto" and self.has_drafter:
                            msg = self.gate.observe(phase, cyc.committed, cyc.t_target + cyc.t_draft, self.engine.policy.verify(1))
                            if msg:
                                gate_notes.append(msg)  # shown after the reply; the status line shows the state now
                    prev, t_prev = copy.deepcopy(st), now
                    emitted += new
                    piece = stream.push(new)
                    pieces.append(piece)
                    if piece:
                        tracker.feed(piece)
                        self.ui.push(piece)
                    self._apply_draft_mode(tracker.phase)
                    recent.append((now, st.generated))
                    while len(recent) > 2 and now - recent[0][0] > 1.0:
                        recent.popleft()
                    self.ui.status(self._status_line(st, recent, t_first, now, tracker))
                    if stop.hit:
                        break
            except KeyboardInterrupt:
                hard = True
            finally:
                gen.close()
        tail = stream.flush()
        if tail:
            pieces.append(tail)
            self.ui.push(tail)
        interrupted = hard or stop.hit
        if hard:
            self.engine.reset()  # stopped mid-cycle: the cache may hold half a cycle
        reply_text = "".join(pieces)
        self.total.merge(st)
        for ph, s in phases.items():
            self.phase_total.setdefault(ph, Stats(drafter=s.drafter)).merge(s)
        self.messages.append({"role": "user", "content": user})
        self.messages.append({"role": "assistant", "content": reply_text})
        reply = Reply(reply_text, emitted, st, phases, interrupted, len(tokens))
        self.messages[-1]["meta"] = self._reply_meta(reply)
        self.last = reply
        self.ui.end_reply(self._final_line(reply, tracker))
        for msg in gate_notes:
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
            self.ui.notice(f"reply stopped at --max-tokens {self.max_tokens}", "dim")
        return reply

    # -- status lines -------------------------------------------------------------
    def _drafter_label(self) -> str:
        if not self.has_drafter:
            return "plain"
        name = self.engine.drafter.name
        if self.draft_mode == "auto":
            return f"{name} auto:{'on' if self.engine.drafting else 'off'}"
        return f"{name} {self.draft_mode}"

    def _status_line(self, st: Stats, recent, t_first, now, tracker: PhaseTracker) -> Text:
        span = recent[-1][0] - recent[0][0] if len(recent) > 1 else 0.0
        cur = (recent[-1][1] - recent[0][1]) / span if span > 0 else 0.0
        avg = (st.generated - 1) / (now - t_first) if t_first and now > t_first else 0.0
        n_ctx = self.engine.ctx.n_ctx
        used = len(self.engine.tokens) + 1
        parts = [
            (f"{cur:6.1f} tok/s", "bold green"),
            (f" · avg {avg:.1f}", ""),
        ]
        if self.has_drafter:
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

    def _final_line(self, reply: Reply, tracker: PhaseTracker) -> Text:
        st = reply.stats
        n_ctx = self.engine.ctx.n_ctx
        used = len(self.engine.tokens) + 1
        parts = [
            f"{st.generated} tok · {st.decode_tps:.1f} tok/s (session {self.total.decode_tps:.1f})",
        ]
        if self.has_drafter:
            parts.append(f" · τ {st.tau:.2f} · accept {100 * st.acceptance:.0f}% ({st.accepted}/{st.drafted})")
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
            self.messages.clear()
            self.first = 0
            self.engine.reset()
            ui.notice("conversation cleared (system prompt and session stats kept)", "green")
        elif name == "/system":
            if not arg:
                ui.info(Text(f"system prompt: {self.system!r}" if self.system else "no system prompt (the template's default applies)"))
            else:
                self.system = arg
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
            elif not self.has_drafter:
                ui.notice("no drafter in this session (plain decoding); start with a pair or --drafter", "bold red")
            else:
                self.draft_mode = arg
                self._apply_draft_mode("answer")
                ui.notice(f"drafting {arg}" + (" (per phase, where it pays)" if arg == "auto" else ""), "green")
        elif name == "/think":
            if not self.can_think:
                ui.notice("this model's chat template has no thinking switch", "bold red")
            elif not arg:
                ui.info(Text(f"thinking: {'template default' if self.thinking is None else ('on' if self.thinking else 'off')}"))
            elif arg not in ("on", "off"):
                ui.notice("/think takes on or off", "bold red")
            else:
                self.thinking = arg == "on"
                ui.notice(f"thinking {arg}", "green")
        elif name == "/stats":
            self.show_stats()
        elif name == "/save":
            if not arg:
                ui.notice("/save needs a file name", "bold red")
            else:
                try:
                    path = self.save(Path(arg).expanduser())
                    ui.notice(f"saved {len(self.messages)} messages to {path}", "green")
                except OSError as e:
                    ui.notice(f"could not save {arg}: {e.strerror or e}", "bold red")
        else:
            ui.notice(f"unknown command {name}; /help lists them (// sends a line that starts with /)", "bold red")
        return True

    def _gate_summary(self) -> str:
        if self.draft_mode != "auto" or not self.gate.states:
            return ""
        return " · " + ", ".join(f"{ph} {'on' if s.on else 'off'}" for ph, s in self.gate.states.items())

    def show_stats(self) -> None:
        from rich.text import Text as T

        from .render import drafting_hist, histogram, position_table, stats_table

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
        if not self.has_drafter or not self.total.drafted:
            ui.info(T("no drafts yet: nothing to show per position", style="dim"))
            return
        ui.info(T("acceptance per draft position (given the earlier ones were accepted)", style="bold"))
        ui.info(position_table(self.total))
        hist, plain = drafting_hist(self.total)
        ui.info(T(f"drafts accepted per cycle ({plain} cycles drafted nothing)" if plain else "drafts accepted per cycle", style="bold"))
        ui.info(histogram(hist))

    def transcript(self) -> dict:
        msgs = []
        if self.system:
            msgs.append({"role": "system", "content": self.system, "in_context": True})
        for i, m in enumerate(self.messages):
            row = {"role": m["role"], "content": m["content"], "in_context": i >= self.first}
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
                "max_tokens": self.max_tokens,
                "ctx": self.engine.ctx.n_ctx,
                "draft": self.draft_mode,
                "thinking": self.thinking,
            },
            "system": self.system,
            "dropped_turns": self.dropped,
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
        bits = [f"{self.model.path.name}", self._drafter_label()]
        bits.append(f"ctx {self.engine.ctx.n_ctx}")
        bits.append(f"temp {self.sampling.temperature:g}")
        if self.can_think:
            bits.append("thinking " + ("default" if self.thinking is None else ("on" if self.thinking else "off")))
        ui.notice("localflash chat · " + " · ".join(bits) + " · /help", "bold")
        if self.thinking is None and self.requested_thinking is not None:
            ui.notice("--think/--no-think ignored: this model's chat template has no thinking switch", "yellow")
        if self.verdict is not None:
            ui.notice(
                f"bench verdict on this rig: {self.engine.drafter.name} {self.verdict.get('speedup', 0):.2f}× plain"
                f" → drafting starts {'on' if self.gate.start_on else 'off'}",
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
                if self.messages and self.messages[-1]["role"] == "user":
                    self.messages.pop()
                self.engine.reset()
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
    }
