"""The Python API: ``load()`` a model (and drafter) once, then stream, generate or chat.

    from localflash import load

    with load(pair="demo") as llm:
        for chunk in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
            print(chunk.text, end="", flush=True)
        print(llm.generate("The capital of France is", max_tokens=8).text)

Loading goes through the same path as the CLI (``engine.open_engine``: pairs,
plan, drafter); requests run on :mod:`localflash.session`, which reuses the
engine's cache across requests. One caller at a time: an LLM is not thread-safe.

The command line and the server are built on this module only: :meth:`LLM.info`
says what was loaded, :meth:`LLM.conversation` is a multi-turn chat with its
drafting phases, :meth:`LLM.off_reason` explains an adaptive drafter that stays off.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localflash.engine import drafter_kind
from localflash.errors import LocalflashError
from localflash.phases import PHASES
from localflash.session import Chunk, Completion, Conversation, Generation, Session
from localflash.speculative.stats import STOP_REASONS, Stats

__all__ = [
    "load", "open_llm", "drafter_kind", "LLM", "LLMInfo", "Conversation", "Generation", "Chunk", "Completion", "Stats",
    "SamplingParams", "STOP_REASONS", "PHASES", "set_verbose",
]


def __getattr__(name):  # SamplingParams pulls in numpy: only on first use, so importing this module stays light
    if name == "SamplingParams":
        from localflash.speculative.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SLOT_PROMPT_SIMILARITY = 0.5  # the share of a slot's cache a prompt must reuse to be routed there (LLM.slot_for; --slot-prompt-similarity)


def load(pair: str | None = None, *, draft: str = "on", **options) -> "LLM":
    """Load a pair from models.toml (``pair="demo"``) or a target file (``model=``), as the CLI does.

    ``options``: the load options of :data:`localflash.config.LOAD_OPTIONS`, the CLI's
    model flags (``model``, ``drafter``, ``spec``, ``ctx``, ``draft_max``, ``fixed``,
    ``p_min``, ``threads``, ``n_gpu_layers``, ``kv``, ``exact``) plus ``vram``, ``gpus``
    and ``derive``; any other keyword is an error. ``draft``: ``on`` (the engine's adaptive draft length), ``off``
    (plain decoding) or ``auto`` (per phase, only where drafting pays).
    """
    from localflash.config import config_from_options

    return open_llm(config_from_options(pair=pair, **options), draft=draft)


def short_thread_spin() -> str | None:
    """For a server process, before it loads llama.cpp: compute threads that wait sleep soon
    (``llama.bindings.short_omp_spin``: GOMP_SPINCOUNT unless the user set one); returns the value set."""
    from localflash.llama.bindings import short_omp_spin

    return short_omp_spin()


def open_llm(cfg, draft: str = "on") -> "LLM":
    """An LLM from a ready ``config.RunConfig`` (the CLI's path)."""
    from localflash.engine import open_engine

    engine = open_engine(cfg)
    try:
        return LLM(engine, cfg, draft=draft)
    except BaseException:
        engine.close()
        raise


@dataclass(frozen=True)
class LLMInfo:
    """What an LLM loaded and how it runs (``LLM.info()``): what the CLI and the server show."""

    name: str  # the pair's name, else the target file's stem
    pair: str | None
    target: Path
    drafter: str  # the drafter kind in use; "none" for plain decoding
    drafter_file: Path | None  # the drafter GGUF (None: ngram, MTP or none)
    n_ctx: int  # the context it runs with (the plan may have rounded or shrunk the wish)
    draft_max: int  # longest draft per cycle (0: no drafter)
    adaptive: bool  # the draft length follows measured acceptance and costs
    threads: int  # CPU threads asked for (0: automatic)
    rollback: str  # how the target cache takes back rejected drafts: kv | snapshot | replay
    plan: Any = None  # the memory plan it loaded with (:class:`localflash.plan.fit.Plan`); None without one
    thinking: bool = False  # the chat template has a thinking switch (``thinking=`` / enable_thinking)
    slots: int = 1  # parallel slots (requests decoded together)
    kv_unified: bool = False  # slots share one KV pool: any request up to n_ctx; else n_ctx is each slot's share
    chat_template: str | None = None  # the target's chat template source (the server detects its tool-call format from it)


class LLM:
    """A loaded target (+ drafter) with its cache; see the module docstring."""

    def __init__(self, engine, config=None, name: str | None = None, draft: str = "on"):
        # parallel slots (a SlotPool): one session per slot; the LLM's own calls use slot 0
        self.pool = engine if hasattr(engine, "slots") else None
        engines = self.pool.slots if self.pool is not None else [engine]
        self.engine = engines[0]
        self.target = engine.target
        self.config = config
        self.name = name or (getattr(config, "pair", None) or Path(self.target.path).stem)
        self.sessions = [Session(e, draft_mode=draft) for e in engines]
        self.session = self.sessions[0]
        self._closed = False

    @property
    def n_slots(self) -> int:
        """Requests this LLM decodes together (``parallel``); 1: one at a time."""
        return len(self.sessions)

    def slots(self) -> list[dict]:
        """What each slot is doing now (state, tokens, τ); one idle slot without parallel slots."""
        if self.pool is not None:
            return self.pool.describe()
        st = self.session.active.stats if self.session.active is not None else None
        return [{"id": 0, "state": "idle" if st is None else "decoding", "n_cached": self.session.n_cached, "n_ctx": self.n_ctx,
                 "drafter": self.drafter, **({"generated": st.generated, "tau": round(st.tau, 3)} if st is not None else {})}]

    def decode_counts(self) -> tuple[int, int] | None:
        """(the target's batched decodes so far, the slots they carried in all); None without parallel slots."""
        return (self.pool.decodes, self.pool.slot_decodes) if self.pool is not None else None

    def generate_batch(self, prompts: list, *, stream: bool = False, **kw) -> list[Completion]:
        """Completions of several prompts decoded together, in the order given (options: see :meth:`start`).

        Raw prompts by default, as :meth:`generate`; messages lists go through the template.
        Up to ``n_slots`` run at once, the rest wait for a free slot. Each result equals
        what the prompt gives alone (greedy; or with the same seed).
        """
        import queue as queue_mod
        import threading

        if stream:
            raise LocalflashError("generate_batch returns whole completions; stream each prompt with start(..., slot=i)")
        self._check_open()
        kw.setdefault("raw", True)
        gens_in = [(i, p) for i, p in enumerate(prompts)]
        for _, p in gens_in:  # every check before any decoding
            if kw["raw"] and not isinstance(p, str):
                raise LocalflashError("generate_batch takes string prompts (or messages with raw=False)")
        todo: queue_mod.Queue = queue_mod.Queue()
        for item in gens_in:
            todo.put(item)
        results: list = [None] * len(prompts)
        errors: list = []

        def run(slot: int) -> None:
            while not errors:
                try:
                    i, p = todo.get_nowait()
                except queue_mod.Empty:
                    return
                try:
                    results[i] = self.start(p, slot=slot, **kw).completion()
                except BaseException as e:  # noqa: BLE001 (raised below, in the caller's thread)
                    errors.append(e)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(min(self.n_slots, len(prompts)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    @property
    def n_ctx(self) -> int:
        return self.engine.ctx.n_ctx

    @property
    def drafter(self) -> str:
        """The drafter's name, "none" for plain decoding."""
        return self.engine.drafter.name if self.session.has_drafter else "none"

    def info(self) -> LLMInfo:
        """What is loaded (files, drafter, context, plan); see :class:`LLMInfo`."""
        cfg, policy = self.config, self.engine.policy
        return LLMInfo(
            name=self.name,
            pair=getattr(cfg, "pair", None),
            target=Path(cfg.target) if cfg is not None else Path(self.target.path),
            drafter=self.drafter,
            drafter_file=Path(cfg.drafter) if cfg is not None and cfg.drafter else None,
            n_ctx=self.n_ctx,
            draft_max=policy.max_draft,
            adaptive=policy.adaptive,
            threads=getattr(cfg, "threads", 0),
            rollback=self.engine.ctx.rollback_path,
            plan=getattr(self.pool or self.engine, "plan", None),
            thinking=self.session.can_think,
            slots=self.n_slots,
            chat_template=self.target.chat_template(),
            kv_unified=bool(self.pool is not None and self.pool.unified),
        )

    def acceptance_note(self, stats) -> str:
        """One line when this run's measured acceptance is far below the pair's expected value (models.toml ``acceptance``),
        naming the likely cause (a quantized drafter or target KV cache) and the fix; "" otherwise (``stats.acceptance_guard``)."""
        from localflash.registry.pairs import get_pair
        from localflash.speculative.stats import acceptance_guard

        cfg = self.config
        if cfg is None:
            return ""
        plan = getattr(self.engine, "plan", None)
        target_kv = plan.type_k if plan is not None else cfg.kv
        drafter_kv = (plan.drafter_type_kv if plan is not None else "") or cfg.kv_drafter or target_kv
        pair = get_pair(cfg.pair) if cfg.pair else None
        # the pair's figure is its own drafter's: a run that drafts with another kind (--spec ngram) is not judged by it
        # (kind dflash: DFlash, DFlash2 and DSpark files)
        kind = {"dflash2": "dflash", "dspark": "dflash"}.get(stats.drafter, stats.drafter)
        expected = pair.acceptance if pair is not None and kind == pair.kind else None
        return acceptance_guard(stats, drafter_kv=drafter_kv, target_kv=target_kv, expected=expected, pair=cfg.pair)

    def off_reason(self) -> str | None:
        """Why the adaptive draft length keeps drafting off, in measured numbers; None while drafting pays (or before it was measured)."""
        return self.engine.policy.off_reason() if self.engine.calibrated else None

    def conversation(
        self, *, system: str | None = None, thinking: bool | None = None, max_tokens: int = 1024,
        draft: str | None = None, verdict: dict | None = None,
    ) -> Conversation:
        """A multi-turn chat on this LLM's cache (the history, its trimming, per-phase drafting).

        ``draft``: on | off | auto (per think/answer phase, only where drafting pays);
        None keeps this LLM's mode. ``verdict``: the saved bench verdict of this
        drafter on this rig (``localflash bench``): its acceptance per draft position
        seeds the draft-length policy and its speedup decides whether ``auto`` starts
        drafting. ``thinking`` is dropped for a template without the switch.
        Requests through :meth:`start` and the others share the same session afterwards.
        """
        self._check_open()
        from localflash.phases import PhaseGate

        start_on = True
        if verdict is not None:
            self.engine.policy.seed(verdict.get("position_acceptance") or [])
            start_on = float(verdict.get("speedup", 1.0)) >= 1.0
        if self.session.active is not None:
            self.session.active.close()
        self.session = self.sessions[0] = Session(self.engine, draft_mode=draft or self.session.draft_mode, gate=PhaseGate(start_on=start_on))
        thinking = thinking if self.session.can_think else None
        return Conversation(self.session, system=system, thinking=thinking, max_tokens=max_tokens)

    def start(
        self, prompt_or_messages, *, max_tokens: int | None = 256, temperature: float = 0.0, top_k: int = 40, top_p: float = 1.0,
        min_p: float = 0.0, seed: int | None = None, stop: list[str] | str | None = None, tools: list[dict] | None = None,
        system: str | None = None, raw: bool = False, thinking: bool | None = None, cancel=None, sampling=None,
        draft_max: int | None = None, slot: int | None = None, grammar: str | None = None, json_schema: dict | None = None,
    ) -> Generation:
        """Check and render the request and return its :class:`~localflash.session.Generation`.

        Every check happens here, before any token is decoded: bad values raise
        LocalflashError, a prompt that does not fit raises ContextOverflow.
        ``draft_max`` caps this request's draft length (0: plain decoding); None: the loaded drafter's.
        ``slot``: which parallel slot runs it (0 .. n_slots-1; None: slot 0); one request per slot at a time.
        ``grammar``: GBNF text (llama.cpp's grammar format, start rule ``root``) every token must follow;
        ``json_schema``: a JSON schema (a dict) the reply must be an instance of (converted to GBNF by
        llama-cpp-python's converter). One of the two at most; a bad one raises GrammarError (``.param``
        names it). Lossless with every drafter, tree and slots included (speculative/grammar.py).
        """
        self._check_open()
        session = self._session(slot)
        if sampling is None:
            sampling = sampling_params(temperature, top_k, top_p, min_p, seed)
        if grammar is not None or json_schema is not None:
            import dataclasses

            from localflash.speculative.grammar import compile_constraint

            sampling = dataclasses.replace(sampling, grammar=compile_constraint(self.target, grammar, json_schema))
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise LocalflashError("tools must be a list of dicts (OpenAI function specs)")
        tokens, text = session.encode(prompt_or_messages, system=system, raw=raw, thinking=thinking, tools=tools)
        return session.start(tokens, text, max_tokens=max_tokens, sampling=sampling, stop=stop, cancel=cancel, draft_max=draft_max)

    def slot_for(self, prompt_or_messages, free: list[int], *, system: str | None = None, raw: bool = False,
                 thinking: bool | None = None, tools: list[dict] | None = None, **_request) -> int:
        """Of the ``free`` slots, the one whose cache shares the longest prefix with this prompt (ties: the first).

        A prefix that reuses less than the load option ``slot_prompt_similarity`` (default
        :data:`SLOT_PROMPT_SIMILARITY`) of a slot's cache does not count there (as llama-server's
        ``--slot-prompt-similarity``): a turn that resends its conversation reuses nearly all of
        its slot's cache, however long its new part. Nor does a prompt that holds all of the slot's last
        prompt, whatever the share: it loses only that slot's last reply (a retry or a regenerate sends the
        same prompt again; the next turn of a thinking model's conversation comes back without the reply's
        reasoning, which was most of the cache). Without such a slot the request goes to the free slot with
        the least worth keeping (an empty one, else the least recently used), so the conversations cached in
        the others stay for their next turn. ``slot_prompt_similarity`` 0 turns the routing off: every request
        goes that way, whatever the caches hold (the slot's own cache is still reused as far as it matches).
        """
        if len(free) == 1 or self.pool is None:
            return free[0]
        similarity = getattr(self.config, "slot_prompt_similarity", SLOT_PROMPT_SIMILARITY)
        used_at = self.pool.kv.used_at
        if not similarity:
            return min(free, key=lambda i: (self.sessions[i].n_cached > 0, used_at[i], i))
        try:
            tokens, _ = self.session.encode(prompt_or_messages, system=system, raw=raw, thinking=thinking, tools=tools)
        except LocalflashError:
            return free[0]  # start() reports what is wrong with the request
        shared = {i: self.sessions[i].cached_prefix(tokens) for i in free}
        similar = [i for i in free if shared[i] and (shared[i] >= similarity * self.sessions[i].n_cached
                                                     or shared[i] >= min(self.sessions[i].last_prompt, self.sessions[i].n_cached) - 1 > 0)]
        if similar:
            return max(similar, key=lambda i: (shared[i], -i))
        return min(free, key=lambda i: (self.sessions[i].n_cached > 0, used_at[i], i))

    def _session(self, slot: int | None) -> Session:
        if slot is None:
            return self.session
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.n_slots:
            raise LocalflashError(f"slot must be in 0..{self.n_slots - 1}, got {slot!r}")
        return self.sessions[slot]

    def stream(self, prompt_or_messages, **kw) -> Iterator[Chunk]:
        """Chunks as they decode; the last one has ``finish_reason`` set. Options: see :meth:`start`.

        A string goes through the chat template as one user message (``raw=True``:
        as is); a list of OpenAI-style messages goes through the template.
        """
        return self.start(prompt_or_messages, **kw)

    def generate(self, prompt: str, *, stream: bool = False, **kw) -> Completion | Iterator[Chunk]:
        """A raw completion of ``prompt`` (no chat template unless ``raw=False`` is passed)."""
        if not isinstance(prompt, str):
            raise LocalflashError("generate() takes a string prompt; use chat() for messages")
        kw.setdefault("raw", True)
        gen = self.start(prompt, **kw)
        return gen if stream else gen.completion()

    def chat(self, messages, *, stream: bool = False, **kw) -> Completion | Iterator[Chunk]:
        """Messages (or one user string) through the model's chat template."""
        gen = self.start(messages, **kw)
        return gen if stream else gen.completion()

    def count_tokens(self, prompt_or_messages, *, system: str | None = None, raw: bool = False, tools: list[dict] | None = None, thinking: bool | None = None) -> int:
        """Length of the rendered prompt in tokens (what ``prompt_tokens`` will say)."""
        self._check_open()
        return len(self.session.encode(prompt_or_messages, system=system, raw=raw, thinking=thinking, tools=tools)[0])

    def reset(self) -> None:
        """Forget the cached tokens (the next request prefills from scratch)."""
        self._check_open()
        self.session.reset()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for session in self.sessions:
                if session.active is not None:
                    session.active.close()
            (self.pool or self.engine).close()

    def _check_open(self) -> None:
        if self._closed:
            raise LocalflashError("this LLM is closed")

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"ctx {self.n_ctx}, drafter {self.drafter}"
        return f"<LLM {self.name}: {state}>"


def set_verbose(on: bool = True) -> None:
    """Show llama.cpp's own log on stderr (off by default)."""
    from localflash.llama import set_verbose as llama_verbose

    llama_verbose(on)


def sampling_params(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, seed=None):
    """SamplingParams from request values; a bad one raises LocalflashError naming it."""
    from localflash.speculative.sampling import SamplingParams

    for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LocalflashError(f"{name} must be a finite number, got {value!r}")
    for name, value in (("top_k", top_k), ("seed", seed)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise LocalflashError(f"{name} must be a whole number, got {value!r}")
    if top_k is None:
        raise LocalflashError("top_k must be a whole number, got None")
    try:
        return SamplingParams(temperature=float(temperature), top_k=top_k, top_p=float(top_p), min_p=float(min_p), seed=seed)
    except LocalflashError as e:  # its messages name the CLI flags
        raise LocalflashError(e.message.replace("--temp ", "temperature ").replace("--top-k", "top_k").replace("--top-p", "top_p").replace("--min-p", "min_p")) from None


def rpc_server(host: str = "127.0.0.1", port: int = 50052, threads: int = 0, allow_remote: bool = False,
               devices: list[str] | None = None) -> None:
    """Lend this machine's CPU (or ``devices``) to another localflash's ``--rpc``: llama.cpp's rpc-server (blocks).

    A host other than loopback needs ``allow_remote=True``: the server has no authentication."""
    from localflash.llama.rpc_server import run

    run(host, port, threads, allow_remote, devices)
