"""The session layer under chat, the server and the Python API (no terminal, no HTTP).

A :class:`Session` owns one Engine and turns requests into :class:`Chunk` s:
messages → the model's chat template (system prompt, thinking switch, tools) →
tokens; the engine's cache is reused for the longest token prefix the prompt
shares with what is cached (``cached_tokens``), across turns and requests.
Text is detokenized UTF-8-safe and held back while it might be the start of a
stop string, so a stop string is never streamed, not even in part. Drafting
follows the phase policy (``phases.py``: own policy per think/answer phase,
a gate under draft mode ``auto``). A ``cancel`` event is checked between
prefill batches and between draft–verify cycles: the engine only ever stops
between cycles, so its cache stays consistent and the next request reuses it.

A :class:`Conversation` is a chat history on a session. When the history no
longer fits it drops the oldest turns in one chunk, down to about half the
context, so the following turns reuse the cache again; dropping one turn per
turn would re-prefill the whole history on every turn once the context is full.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from localflash.errors import ContextOverflow, LocalflashError
from localflash.phases import PhaseGate, PhaseTracker, diff_stats, initial_phase
from localflash.speculative.stats import Stats

# Stats.stop -> the finish_reason callers see
FINISH = {"eog": "stop", "stop": "stop", "length": "length", "context": "context", "cancelled": "cancelled"}
DRAFT_MODES = ("on", "off", "auto")


@dataclass
class Chunk:
    text: str  # new text; "" while everything new is held back (a possible stop string, half a character)
    token_ids: list[int]  # the tokens this cycle committed (text and ids need not line up exactly)
    finish_reason: str | None  # None until the last chunk: stop | length | context | cancelled
    stats: Stats  # running stats of this request
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the engine cache
    phase: str = "answer"  # think | answer, after this chunk
    # where the tokens came from (sums over a reply: Stats.drafted, Stats.accepted, Stats.generated tokens)
    drafted: int = 0  # draft tokens proposed in the cycle(s) since the previous chunk
    accepted: int = 0  # of those, accepted: the first ``accepted`` of token_ids; the rest are the target's own
    token_chars: list[int] = field(default_factory=list)  # characters each of token_ids added to the text before stop holdback


@dataclass
class Completion:
    text: str
    finish_reason: str
    stats: Stats
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    token_ids: list[int] = field(default_factory=list)


class StopMatcher:
    """Finds the first stop string in streamed text; holds back a tail that may begin one."""

    def __init__(self, stops: list[str] | None):
        self.stops = [s for s in (stops or []) if s]
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """The text safe to emit now and whether a stop string completed (then: the text before it)."""
        if not self.stops:
            return text, False
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)], True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        self.pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Session:
    """One Engine, its template and drafting policy; requests run one at a time."""

    def __init__(self, engine, draft_mode: str = "on", gate: PhaseGate | None = None):
        from localflash.prompt import supports_thinking

        if draft_mode not in DRAFT_MODES:
            raise LocalflashError(f"draft mode must be on, off or auto, got {draft_mode!r}")
        self.engine = engine
        self.model = engine.target
        self.can_think = supports_thinking(self.model)
        self.has_drafter = engine.policy.max_draft > 0
        self.gate = gate or PhaseGate()
        self.draft_mode = draft_mode if self.has_drafter else "off"
        self.policies = {"answer": engine.policy}
        self.active: Generation | None = None
        self.last_prompt = 0  # tokens of the last request's prompt
        self.apply_draft_mode("answer")

    @property
    def n_ctx(self) -> int:
        return self.engine.ctx.n_ctx

    @property
    def n_cached(self) -> int:
        """Tokens in the engine's cache now."""
        return len(self.engine.tokens)

    @property
    def drafting(self) -> bool:
        """Whether the next cycle drafts (the draft mode and, under ``auto``, the phase gate decide)."""
        return self.engine.drafting

    def reset(self) -> None:
        """Forget the cached tokens (the next request prefills from scratch)."""
        self.engine.reset()

    # -- prompts -------------------------------------------------------------------
    def render(self, messages: list[dict], thinking: bool | None = None, tools: list[dict] | None = None) -> str:
        from localflash.prompt import render_chat

        return render_chat(self.model, messages, add_generation_prompt=True, thinking=thinking if self.can_think else None, tools=tools)

    def encode(self, prompt_or_messages, *, system: str | None = None, raw: bool = False, thinking: bool | None = None, tools: list[dict] | None = None) -> tuple[list[int], str]:
        """Prompt tokens and the rendered text. A string with ``raw`` (or a model without a template) goes as is."""
        from localflash.prompt import tokenize_prompt

        if isinstance(prompt_or_messages, str):
            if raw or not self.model.chat_template():
                return self.model.tokenize(prompt_or_messages, add_special=True, parse_special=False), prompt_or_messages
            messages = [{"role": "user", "content": prompt_or_messages}]
        elif isinstance(prompt_or_messages, (list, tuple)):
            if raw:
                raise LocalflashError("raw=True takes a string prompt, not messages")
            messages = list(prompt_or_messages)
            for i, m in enumerate(messages):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise LocalflashError(f"message {i} must be a dict with a 'role'")
        else:
            raise LocalflashError(f"a prompt is a string or a list of messages, not {type(prompt_or_messages).__name__}")
        if system is not None:
            messages = [{"role": "system", "content": system}] + [m for m in messages if m.get("role") not in ("system", "developer")]
        text = self.render(messages, thinking, tools)
        return tokenize_prompt(self.model, text), text

    def cached_prefix(self, tokens: list[int]) -> int:
        """Prompt tokens the engine keeps from its cache (the last one is always decoded again)."""
        n = 0
        for a, b in zip(self.engine.tokens, tokens):
            if a != b:
                break
            n += 1
        return min(n, len(tokens) - 1)

    # -- drafting policy --------------------------------------------------------------
    def policy_for(self, phase: str):
        if phase not in self.policies:
            from localflash.speculative.adapt import DraftPolicy

            base = self.policies["answer"]
            p = DraftPolicy(base.max_draft, base.adaptive, base.draft_cost_grows)
            p.verify, p.draft = base.verify, base.draft  # costs belong to the machine, acceptance to the phase
            self.policies[phase] = p
        return self.policies[phase]

    def apply_draft_mode(self, phase: str) -> None:
        if not self.has_drafter:
            self.engine.drafting = False
            return
        self.engine.policy = self.policy_for(phase)
        if self.draft_mode == "on":
            self.engine.drafting = True
        elif self.draft_mode == "off":
            self.engine.drafting = False
        else:
            self.engine.drafting = self.gate.wants(phase)

    def set_draft_mode(self, mode: str) -> None:
        if mode not in DRAFT_MODES:
            raise LocalflashError(f"draft mode must be on, off or auto, got {mode!r}")
        self.draft_mode = mode if self.has_drafter else "off"
        self.apply_draft_mode("answer")

    # -- requests ---------------------------------------------------------------------
    def start(self, tokens: list[int], text: str = "", *, max_tokens: int | None = 256, sampling=None, stop: list[str] | None = None, cancel=None,
              draft_max: int | None = None) -> "Generation":
        """Check the request and return its Generation (iterate it for chunks).

        ``draft_max`` caps this request's draft length (0: no drafting); None keeps the session's.

        Raises :class:`ContextOverflow` when the prompt leaves no room to generate.
        Starting a request ends an unfinished earlier one (its engine state is kept).
        """
        if not tokens:
            raise LocalflashError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            pool = getattr(self.engine, "pool", None)
            if pool is not None:  # a parallel slot: its share of the context
                raise ContextOverflow(len(tokens), self.n_ctx,
                                      message=f"the prompt has {len(tokens)} tokens but one slot holds {self.n_ctx} "
                                              f"(the context is shared by {pool.n_slots} slots)",
                                      hint="shorten the prompt, or restart with a larger -c/--ctx or a smaller --parallel")
            raise ContextOverflow(len(tokens), self.n_ctx)
        if max_tokens is None:
            max_tokens = self.n_ctx - len(tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise LocalflashError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and not all(isinstance(s, str) for s in stop):
            raise LocalflashError("stop must be a string or a list of strings")
        if draft_max is not None and (isinstance(draft_max, bool) or not isinstance(draft_max, int) or draft_max < 0):
            raise LocalflashError(f"draft_max must be a whole number of at least 0, got {draft_max!r}")
        if self.active is not None:
            self.active.close()
        self.last_prompt = len(tokens)  # (LLM.slot_for: a request that repeats or extends it loses only the last reply)
        self.active = Generation(self, list(tokens), text, max_tokens, sampling, stop, cancel, draft_max)
        return self.active


class Generation:
    """One request on a Session: iterate it for Chunks; it keeps the totals as it goes."""

    def __init__(self, session: Session, prompt: list[int], prompt_text: str, max_tokens: int, sampling, stop, cancel, draft_max=None):
        from localflash.prompt import TextStream

        self.session = session
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.cancel = cancel
        self.draft_max = draft_max
        self.stats = Stats()
        self.prompt_tokens = len(prompt)
        self.cached_tokens = self.stats.cached_tokens = session.cached_prefix(prompt)
        self.tokens: list[int] = []  # every token generated (some may follow a stop string)
        self.text = ""  # the text streamed so far
        self.finish_reason: str | None = None
        self.phases: dict[str, Stats] = {}  # per-phase cycle stats (the first token comes from prefill)
        self.notes: list[str] = []  # drafting turned on/off by the gate
        self.tracker = PhaseTracker(initial_phase(prompt_text) if session.can_think else "answer")
        self.t_first: float | None = None
        self._detok = TextStream(session.model)
        self._stops = StopMatcher(stop)
        self._told = (0, 0)  # (drafted, accepted) already reported in chunks
        self._it = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> Chunk:
        return next(self._it)

    def close(self) -> None:
        """Stop here (between cycles); the engine cache stays consistent."""
        self._it.close()
        if self.session.active is self:
            self.session.active = None

    def unsent(self) -> str:
        """Text produced but not streamed yet (after an interrupt); it counts as streamed from now on."""
        rest = self._stops.flush() + self._detok.flush()
        self.text += rest
        return rest

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _chunk(self, text: str, ids: list[int], finish: str | None = None, chars: list[int] | None = None) -> Chunk:
        st, (drafted, accepted) = self.stats, self._told
        self._told = (st.drafted, st.accepted)
        return Chunk(text, ids, finish, st, self.prompt_tokens, self.cached_tokens, self.tracker.phase,
                     st.drafted - drafted, st.accepted - accepted, chars or [])

    def _run(self):
        s, st = self.session, self.stats
        eng = s.engine
        s.apply_draft_mode(self.tracker.phase)
        t_steps = self._prefill_in_steps()
        if self._cancelled():
            st.stop = "cancelled"
            yield self._finish("")
            return
        on_pool = {"cancel": self.cancel} if getattr(eng, "pool", None) is not None else {}  # a parallel slot stops before its next step
        gen = eng.generate(self.prompt, self.max_tokens, self.sampling, st, self.draft_max, **on_pool)
        last: list[int] = []
        chars: list[int] = []
        tail = ""
        try:
            prev, t_prev = st.snapshot(), time.perf_counter()
            for new in gen:
                now = time.perf_counter()
                if t_steps:
                    st.t_prefill += t_steps
                    t_steps = 0.0
                phase = self.tracker.phase
                if self.t_first is None:
                    self.t_first = now
                    # an engine that had to resume earlier than the shared prefix (a recurrent state
                    # checkpoint) may say so in st.cached_tokens; never report more than it kept
                    self.cached_tokens = st.cached_tokens = min(self.cached_tokens, st.cached_tokens)
                else:
                    cyc = diff_stats(st, prev, now - t_prev)
                    self.phases.setdefault(phase, Stats(drafter=st.drafter)).merge(cyc)
                    if s.draft_mode == "auto" and s.has_drafter:
                        msg = s.gate.observe(phase, cyc.committed, cyc.t_target + cyc.t_draft, eng.policy.verify(1))
                        if msg:
                            self.notes.append(msg)
                prev, t_prev = st.snapshot(), now  # (its lists copied: 1.7 us; a deepcopy took 31 us a token)
                self.tokens += new
                parts = [self._detok.push([t]) for t in new]  # one token at a time: each token's share of the text
                piece, chars = "".join(parts), [len(p) for p in parts]
                if piece:
                    self.tracker.feed(piece)
                s.apply_draft_mode(self.tracker.phase)
                out, hit = self._stops.push(piece)
                if hit:
                    st.stop, last, tail = "stop", new, out
                    break
                self.text += out
                yield self._chunk(out, new, chars=chars)
                if self._cancelled():
                    st.stop = "cancelled"
                    break
        finally:
            gen.close()  # between cycles: the engine's cache holds exactly what it committed
            if not st.stop:
                st.stop = "cancelled"  # the caller closed the stream
            if self.session.active is self:
                self.session.active = None
        yield self._finish(tail if st.stop == "stop" else self._last_text(), last, chars if last else None)  # after a stop string: nothing more

    def _last_text(self) -> str:
        out, hit = self._stops.push(self._detok.flush())
        if hit:
            self.stats.stop = "stop"
            return out
        return out + self._stops.flush()

    def _finish(self, text: str, ids: list[int] | None = None, chars: list[int] | None = None) -> Chunk:
        self.text += text
        self.finish_reason = FINISH.get(self.stats.stop, "stop")
        return self._chunk(text, ids or [], self.finish_reason, chars)

    def _prefill_in_steps(self) -> float:
        """A long uncached prompt part is prefilled batch by batch here, checking ``cancel`` in between."""
        eng = self.session.engine
        step = eng.ctx.n_batch
        start, end = self.cached_tokens, len(self.prompt) - 1
        if self.cancel is None or end - start <= 2 * step or getattr(eng, "pool", None) is not None:
            return 0.0  # a parallel slot's pool prefills in chunks itself and sees the cancel before each
        t0 = time.perf_counter()
        scratch = Stats()
        for upto in range(start + step, end, step):
            if self._cancelled():
                break
            eng._prefill(self.prompt[:upto], scratch)  # the engine's own prefill, one batch further each time
        return time.perf_counter() - t0

    def completion(self) -> Completion:
        """Run to the end (if not already) and return the whole result."""
        for _ in self:
            pass
        return Completion(self.text, self.finish_reason or FINISH.get(self.stats.stop, "stop"), self.stats, self.prompt_tokens, self.cached_tokens, len(self.tokens), list(self.tokens))


class Conversation:
    """A chat history on a Session; trims the oldest turns in one chunk when the context is full."""

    def __init__(self, session: Session, system: str | None = None, thinking: bool | None = None, max_tokens: int = 1024, keep: float = 0.5):
        self.session = session
        self.system = system
        self.thinking = thinking
        self.max_tokens = max_tokens
        self.keep = keep  # after a trim the prompt (+ reserve) fits in this share of the context
        self.messages: list[dict] = []  # every turn; messages[self.first:] are in the context
        self.first = 0
        self.dropped = 0  # turns dropped so far
        self.last_trim = (0, 0)  # (turns, tokens) the last build_prompt dropped

    # what the session decides, seen from the conversation
    n_ctx = property(lambda self: self.session.n_ctx)
    n_cached = property(lambda self: self.session.n_cached)
    can_think = property(lambda self: self.session.can_think)
    has_drafter = property(lambda self: self.session.has_drafter)
    draft_mode = property(lambda self: self.session.draft_mode)
    drafting = property(lambda self: self.session.drafting)
    gate = property(lambda self: self.session.gate)

    def set_draft_mode(self, mode: str) -> None:
        """on | off | auto (a session without a drafter stays off)."""
        self.session.set_draft_mode(mode)

    def start(self, tokens: list[int], text: str = "", *, sampling=None, cancel=None) -> "Generation":
        """The reply to a prompt from :meth:`build_prompt` (up to ``max_tokens``); iterate it for chunks."""
        return self.session.start(tokens, text, max_tokens=self.max_tokens, sampling=sampling, cancel=cancel)

    def add_turn(self, user: str, reply: str, meta: dict | None = None) -> None:
        """Append a finished turn to the history (``meta``: kept with the reply, never sent to the template)."""
        self.messages.append({"role": "user", "content": user})
        self.messages.append({"role": "assistant", "content": reply, **({"meta": meta} if meta is not None else {})})

    def clear(self) -> None:
        """Forget every turn and the cache (the system prompt and the thinking switch stay)."""
        self.messages.clear()
        self.first = 0
        self.session.reset()

    def reserve(self) -> int:
        """Room kept free for the reply when deciding whether the history still fits."""
        return min(self.max_tokens, max(32, self.session.n_ctx // 4))

    def trim_goal(self) -> int:
        """Prompt + reserve fit in this many tokens right after a trim."""
        return int(self.session.n_ctx * self.keep)

    def context_messages(self, user: str) -> list[dict]:
        sys_msg = [{"role": "system", "content": self.system}] if self.system else []
        turns = [{k: v for k, v in m.items() if k != "meta"} for m in self.messages[self.first :]]
        return sys_msg + turns + [{"role": "user", "content": user}]

    def _encode(self, user: str) -> tuple[list[int], str]:
        return self.session.encode(self.context_messages(user), thinking=self.thinking)

    def build_prompt(self, user: str) -> tuple[list[int], str]:
        """Tokens and text of the next prompt; when full, drops whole old turns (never the system prompt).

        It drops as few turns as bring prompt + reserve within :meth:`trim_goal`
        (or, if even dropping all cannot, within the context), so the cache is
        reused for the turns that follow. Raises ContextOverflow when nothing fits.
        """
        n_ctx, reserve = self.session.n_ctx, self.reserve()
        tokens, text = self._encode(user)
        self.last_trim = (0, 0)
        if len(tokens) + reserve <= n_ctx:
            return tokens, text
        start, before = self.first, len(tokens)
        fits = None  # the first (fewest turns dropped) candidate that fits the context at all
        while len(tokens) + reserve > self.trim_goal():
            nxt = self._next_turn_start(self.first)
            if nxt is None:
                break
            self.first = nxt
            tokens, text = self._encode(user)
            if fits is None and len(tokens) + reserve <= n_ctx:
                fits = (self.first, tokens, text)
        if len(tokens) + reserve > self.trim_goal() and fits is not None:
            self.first, tokens, text = fits
        if len(tokens) + reserve > n_ctx:
            self.first = start
            raise ContextOverflow(
                len(tokens), n_ctx,
                message=f"this message needs {len(tokens)} prompt tokens (+{reserve} for the reply) but the context holds {n_ctx}",
                hint="shorten it, shorten the system prompt, or restart with a larger -c/--ctx",
            )
        turns = sum(1 for m in self.messages[start : self.first] if m["role"] == "user")
        self.dropped += turns
        self.last_trim = (turns, before - len(tokens))
        return tokens, text

    def _next_turn_start(self, i: int) -> int | None:
        """Index just past the turn that starts at ``i`` (None: no turn left to drop)."""
        if i >= len(self.messages):
            return None
        j = i + 1
        while j < len(self.messages) and self.messages[j]["role"] != "user":
            j += 1
        return j
