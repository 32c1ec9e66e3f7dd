"""How the served model's replies are read: its tool-call format, its thinking, and forced calls.

:class:`ChatStyle` is made once per server from the target's chat template: the
tool-call format (detected, or ``--tool-format``), whether the template thinks and
whether its generation prompt opens the thinking block, and the server-wide
defaults (``--reasoning-format``, ``--think/--no-think``). For each chat request
:meth:`ChatStyle.plan` fills in the thinking default, turns ``tool_choice``
``required`` or a named function into a grammar in the model's own call format,
and says how the reply is split (:class:`ReplyPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localflash.errors import LocalflashError
from localflash.serve import schemas as S
from localflash.serve.errors import APIError
from localflash.serve.reasoning import CLOSE, OPEN, ReasoningSplit
from localflash.serve.toolcalls import CallStream, Format, detect_format, get_format
from localflash.serve.toolcalls.grammar import tool_grammar

REASONING_FORMATS = ("auto", "none", "deepseek")  # llama-server's names; deepseek is auto here


@dataclass(frozen=True)
class ReplyOptions:
    """Server-wide: ``tool_format`` None detects it; ``reasoning`` auto | none; ``thinking`` the enable_thinking default."""

    tool_format: str | None = None
    reasoning: str = "auto"
    thinking: bool | None = None

    def check(self) -> "ReplyOptions":
        if self.tool_format is not None:
            get_format(self.tool_format)  # raises with the known names
        if self.reasoning not in REASONING_FORMATS:
            raise LocalflashError(f"unknown reasoning format {self.reasoning!r}", hint="--reasoning-format takes auto or none")
        return self


@dataclass
class ReplyPlan:
    """What one chat reply is read with: tool calls (format + tools) and thinking."""

    fmt: Format | None
    tools: list[dict] | None
    opened: bool | None  # None: no reasoning split; else whether the prompt opened the thinking block

    def calls(self) -> CallStream | None:
        return self.fmt.stream(self.tools) if self.fmt is not None and self.tools else None

    def reasoning(self) -> ReasoningSplit | None:
        return None if self.opened is None else ReasoningSplit(self.opened)


class _TemplateOnly:
    """The bits of a model ``prompt.render_chat`` reads, for rendering the template without the model."""

    bos = eos = -1

    def __init__(self, source: str):
        self.source, self.path = source, Path("the model")

    def chat_template(self) -> str:
        return self.source

    def token_text(self, token: int) -> str:
        return ""


class ChatStyle:
    def __init__(self, info, options: ReplyOptions | None = None):
        self.options = (options or ReplyOptions()).check()
        self.template = getattr(info, "chat_template", None) or ""
        self.format = get_format(self.options.tool_format) if self.options.tool_format else detect_format(self.template)
        self.can_think = bool(getattr(info, "thinking", False))
        self.thinks = self.can_think or OPEN in self.template
        self._opens: dict = {}

    def opens_thinking(self, thinking: bool | None) -> bool:
        """Whether the generation prompt leaves a ``<think>`` open (for this enable_thinking value)."""
        if thinking not in self._opens:
            from localflash.prompt import render_chat

            try:
                text = render_chat(_TemplateOnly(self.template), [{"role": "user", "content": "Hi"}], thinking=thinking)
            except LocalflashError:
                text = ""
            self._opens[thinking] = text.rfind(OPEN) > text.rfind(CLOSE)
        return self._opens[thinking]

    def plan(self, body: S.ChatCompletionRequest, params: dict, llm) -> ReplyPlan:
        """Fill in the thinking default and a forced call's grammar; say how the reply is read."""
        asked_thinking = "thinking" in params  # the request's own chat_template_kwargs.enable_thinking
        if not asked_thinking and self.options.thinking is not None and self.can_think:
            params["thinking"] = self.options.thinking
        tools = params.get("tools")
        choice = body.tool_choice
        forced = bool(tools) and (choice == "required" or isinstance(choice, S.NamedToolChoice))
        if forced and self.thinks and not asked_thinking and self.opens_thinking(params.get("thinking")) \
                and not self.opens_thinking(False):
            params["thinking"] = False  # a forced call starts at the first token: no thinking block before it unless asked
        if forced:
            name = choice.function.get("name") if isinstance(choice, S.NamedToolChoice) else None
            if isinstance(choice, S.NamedToolChoice) and not isinstance(name, str):
                raise APIError(400, "tool_choice.function.name must name one of the tools", param="tool_choice")
            if name is not None and name not in {t["function"]["name"] for t in tools}:
                raise APIError(400, f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
            grammar = tool_grammar(self.format.name, tools, name, parallel=body.parallel_tool_calls is not False)
            if self.thinks and self.opens_thinking(params.get("thinking")):
                grammar = after_thinking(grammar)  # the prompt opened <think>: the call follows its close
            constrain(params, grammar, llm)
        elif choice == "required" or isinstance(choice, S.NamedToolChoice):
            raise APIError(400, "tool_choice 'required' or a named function needs tools", param="tool_choice")
        reasoning = getattr(body, "reasoning_format", None) or self.options.reasoning
        if reasoning not in REASONING_FORMATS:
            raise APIError(400, f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}", param="reasoning_format")
        opened = None
        if reasoning != "none" and self.thinks:
            opened = self.opens_thinking(params.get("thinking"))
        return ReplyPlan(self.format if tools else None, tools, opened)


# text that does not contain </think> (then the tag, then the call)
THINK_TEXT = ('think-text ::= ( [^<] | "<" [^/] | "</" [^t] | "</t" [^h] | "</th" [^i] | "</thi" [^n] | "</thin" [^k] '
              '| "</think" [^>] )*')


def after_thinking(grammar: str) -> str:
    """``grammar`` (GBNF, start rule ``root``) after a thinking block the prompt opened: its text, ``</think>``, then the call."""
    lines = grammar.splitlines()
    lines = ["forced-root ::=" + ln[len("root ::="):] if ln.startswith("root ::=") else ln for ln in lines]
    return "\n".join(['root ::= think-text "</think>" [\n]* forced-root', THINK_TEXT, *lines]) + "\n"


def constrain(params: dict, grammar: str, llm) -> None:
    """Decode this request under ``grammar`` (GBNF): ``llm.chat(messages, grammar=GBNF, ...)``.

    The LLM takes the ``grammar=`` keyword once grammar-constrained decoding is in the
    engine; until then a forced call is a 400 that says so.
    """
    import inspect

    start = getattr(llm, "start", None)
    if start is None or "grammar" not in inspect.signature(start).parameters:
        raise APIError(400, "tool_choice 'required' or a named function needs grammar-constrained decoding, "
                       "which this engine does not have yet (use tool_choice 'auto')", code="unsupported_value", param="tool_choice")
    params["grammar"] = grammar
