"""DeepSeek V3 / R1 (and the R1 distills) calls in DeepSeek's special tokens; V3.1's shorter form too.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Parallel calls are more ``<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>`` blocks (newline between)
inside the one ``calls`` pair. V3.1 writes ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>``.

Chosen as the fifth format because the DeepSeek-R1 distills (Qwen 1.5B-32B and Llama 8B/70B)
are among the most downloaded thinking GGUFs, and they think in ``<think>`` too, so one
model family exercises tool calls and reasoning together.
"""

from __future__ import annotations

import re

from localflash.serve.toolcalls.base import Format, Section, ToolCall, Tools, dumps, loads_object

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCED = re.compile(r"^\s*(?:function)?\s*" + re.escape(SEP) + r"\s*([^\n]+?)\s*\n\s*```(?:json)?\s*\n(.*?)\n?\s*```\s*$", re.S)
PLAIN = re.compile(r"^\s*([^\n<]+?)\s*" + re.escape(SEP) + r"\s*(\{.*\})\s*$", re.S)


def parse_calls(body: str, tools: Tools) -> list[ToolCall] | None:
    text = body.strip()
    calls = []
    while text:
        if not text.startswith(CALL_BEGIN):
            return None
        end = text.find(CALL_END)
        if end < 0:
            return None
        one, text = text[len(CALL_BEGIN):end], text[end + len(CALL_END):].lstrip()
        m = FENCED.match(one) or PLAIN.match(one)
        if m is None:
            return None
        args = loads_object(m.group(2))
        if args is None:
            return None
        calls.append(ToolCall(m.group(1), dumps(args)))
    return calls or None


class DeepSeek(Format):
    name = "deepseek"
    description = "DeepSeek V3/R1 (and R1 distills), V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁calls▁end｜>"
    sections = (Section(CALLS_BEGIN, CALLS_END, parse_calls),)

    @classmethod
    def detect(cls, template: str) -> bool:
        return CALLS_BEGIN in template
