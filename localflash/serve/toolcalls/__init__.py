"""Tool calls in model output, one parser class per format behind a registry by name.

Each family writes calls its own way (see the modules); the format a model uses
is detected from its chat template (``detect``: the first format whose markers the
template prints; more specific ones are asked first), and ``localflash serve
--tool-format NAME`` overrides it. Every format turns text into OpenAI
``tool_calls`` through the same :class:`~localflash.serve.toolcalls.base.CallStream`:
parallel calls get an index each, streamed deltas carry id and name first and then
the arguments, and a call that does not parse stays content as written.
"""

from __future__ import annotations

from localflash.errors import LocalflashError
from localflash.serve.toolcalls.base import CallStream, Format, Registry, ToolCall, Tools
from localflash.serve.toolcalls.deepseek import DeepSeek
from localflash.serve.toolcalls.hermes import Hermes
from localflash.serve.toolcalls.llama3 import Llama3JSON
from localflash.serve.toolcalls.mistral import Mistral
from localflash.serve.toolcalls.qwen_xml import QwenXML

REGISTRY = Registry()
# detection order: the XML form before Hermes (Qwen3.5 templates also print <tool_call>)
for _cls in (QwenXML, DeepSeek, Mistral, Llama3JSON, Hermes):
    REGISTRY.add(_cls)
DEFAULT = "hermes"  # a template that shows no known format (or none at all): today's behaviour
NAMES = tuple(REGISTRY.formats)


def get_format(name: str) -> Format:
    """The format called ``name``; a LocalflashError naming the known ones otherwise."""
    cls = REGISTRY.formats.get(name)
    if cls is None:
        raise LocalflashError(f"unknown tool-call format {name!r}", hint=f"--tool-format takes one of: {', '.join(NAMES)}")
    return cls()


def detect_format(template: str | None) -> Format:
    """The format a chat template's source shows (``hermes`` when it shows none of them)."""
    for cls in REGISTRY.formats.values():
        if template and cls.detect(template):
            return cls()
    return REGISTRY.formats[DEFAULT]()


def parse_tool_calls(text: str, fmt: Format | None = None, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """Whole text -> (content, calls)."""
    s = (fmt or get_format(DEFAULT)).stream(tools)
    content, calls = s.feed(text)
    tail, more = s.flush()
    return content + tail, calls + more


__all__ = ["CallStream", "Format", "NAMES", "REGISTRY", "ToolCall", "Tools", "detect_format", "get_format", "parse_tool_calls"]
