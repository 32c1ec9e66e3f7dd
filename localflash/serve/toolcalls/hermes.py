"""Hermes / Qwen2.5 / QwQ / Qwen3 JSON calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Qwen2.5-Coder's habit is recognised too: it writes a call as a fenced JSON block
(```` ```json {"name": ..., "arguments": ...} ``` ````), as the malformed example in its
GGUF's template shows it. Such a block is a call only when ``name`` is one of the
request's tools, so an answer that shows JSON stays content.
"""

from __future__ import annotations

from localflash.serve.toolcalls.base import Format, Section, ToolCall, Tools, call_from_object, loads_object


def parse_tagged(block: str, tools: Tools) -> list[ToolCall] | None:
    call = call_from_object(loads_object(block.strip()), tools)
    return [call] if call else None


def parse_fenced(block: str, tools: Tools) -> list[ToolCall] | None:
    call = call_from_object(loads_object(block.strip()), tools, need_known=True)
    return [call] if call else None


class Hermes(Format):
    name = "hermes"
    description = "Hermes 2 Pro/3, Qwen2.5(-Coder), QwQ, Qwen3: <tool_call>{json}</tool_call> (and Qwen2.5-Coder's ```json blocks)"
    sections = (
        Section("<tool_call>", "</tool_call>", parse_tagged),
        Section("```json", "```", parse_fenced),
    )

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<tool_call>" in template
