"""Thinking and answer phases: where a reply is, and whether drafting pays there.

Text inside ``<think>…</think>`` is the *think* phase, the rest the *answer*
phase. Each phase has its own stats and its own draft-length policy (the
measured costs are shared); under draft mode ``auto`` a :class:`PhaseGate` turns
drafting off in a phase where it decodes slower than plain decoding and probes
now and then to turn it back on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localflash.speculative.stats import Stats

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PHASES = ("think", "answer")


def initial_phase(prompt_text: str) -> str:
    """``think`` when the rendered prompt leaves a ``<think>`` open (the template pre-opened it)."""
    return "think" if prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE) else "answer"


class PhaseTracker:
    """Follows ``<think>``/``</think>`` through streamed text (tags may arrive split over pieces)."""

    def __init__(self, phase: str = "answer"):
        self.phase = phase
        self.seen_think = phase == "think"
        self._tail = ""

    def feed(self, text: str) -> str:
        buf = self._tail + text
        i = 0
        while True:
            tag = THINK_CLOSE if self.phase == "think" else THINK_OPEN
            j = buf.find(tag, i)
            if j < 0:
                break
            self.phase = "answer" if self.phase == "think" else "think"
            self.seen_think = True
            i = j + len(tag)
        keep = len(THINK_CLOSE) - 1  # enough to complete a tag split over two pieces
        self._tail = buf[max(i, len(buf) - keep) :]
        return self.phase


@dataclass
class _GateState:
    on: bool = True
    window: deque = field(default_factory=lambda: deque(maxlen=24))  # (tokens, seconds) per cycle
    off_tokens: int = 0
    probing: bool = False


class PhaseGate:
    """Per-phase on/off for drafting under ``/draft auto``.

    While a phase drafts, its recent cycles give tokens per second of
    target+drafter time; ``plain_cost`` is the measured seconds of a one-token
    target pass. Below ``off_below`` × the plain rate (after ``min_cycles``
    cycles) the phase turns drafting off; after ``probe_after`` plain tokens it
    drafts again for a probe and stays on only at ``on_above`` × plain or more
    (the gap keeps it from flapping near 1×).
    """

    def __init__(self, start_on: bool = True, min_cycles: int = 12, probe_after: int = 64, off_below: float = 0.95, on_above: float = 1.05):
        self.start_on = start_on
        self.min_cycles = min_cycles
        self.probe_after = probe_after
        self.off_below = off_below
        self.on_above = on_above
        self.states: dict[str, _GateState] = {}

    def state(self, phase: str) -> _GateState:
        if phase not in self.states:
            self.states[phase] = _GateState(on=self.start_on)
        return self.states[phase]

    def wants(self, phase: str) -> bool:
        return self.state(phase).on

    def observe(self, phase: str, tokens: int, seconds: float, plain_cost: float | None) -> str | None:
        """Record one cycle of ``phase``; return a notice when the phase turns drafting on or off."""
        s = self.state(phase)
        if not s.on:
            s.off_tokens += tokens
            if s.off_tokens >= self.probe_after:
                s.on, s.probing, s.off_tokens = True, True, 0
                s.window.clear()
            return None
        s.window.append((tokens, seconds))
        if plain_cost is None or plain_cost <= 0 or len(s.window) < self.min_cycles:
            return None
        spent = sum(t for _, t in s.window)
        ratio = sum(n for n, _ in s.window) / spent * plain_cost if spent > 0 else float("inf")  # spec over plain
        if s.probing:
            s.probing = False
            if ratio >= self.on_above:
                return f"drafting back on in the {phase} phase: {ratio:.2f}× plain"
            s.on = False
            s.window.clear()
            return None
        if ratio < self.off_below:
            s.on, s.off_tokens = False, 0
            s.window.clear()
            return f"drafting off in the {phase} phase: {ratio:.2f}× plain"
        return None


def diff_stats(now: Stats, before: Stats, wall: float) -> Stats:
    """The counts ``now`` added since ``before``; ``wall`` seconds of decoding."""
    d = Stats(drafter=now.drafter)
    for name in ("generated", "committed", "cycles", "drafted", "accepted"):
        setattr(d, name, getattr(now, name) - getattr(before, name))
    d.t_target = now.t_target - before.t_target
    d.t_draft = now.t_draft - before.t_draft
    d.t_decode = wall
    for name in ("accept_hist", "pos_tries", "pos_hits"):
        a, b = getattr(now, name), getattr(before, name)
        setattr(d, name, [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)])
    return d
