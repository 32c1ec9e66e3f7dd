"""Thinking text out of the reply: ``<think>…</think>`` -> ``reasoning_content``, the rest -> ``content``.

A thinking model's reply begins with its thinking block, or the chat template
opened the block itself (the prompt ends in ``<think>\\n``, as Qwen3.5/3.6 and the
DeepSeek-R1 distills do) and the reply begins inside it. Whitespace around the
thinking text is dropped, as llama-server and vLLM drop it; a ``<think>`` later in
the answer is content. A reply cut off while thinking keeps what it thought as
reasoning. Fed in deltas of any size, it gives what the whole text gives.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ReasoningSplit:
    """Feed text deltas; get back (reasoning delta, content delta)."""

    def __init__(self, opened: bool = False):
        self.state = "think" if opened else "start"  # start: the reply may open a block; answer: all content
        self.buf = ""
        self.fresh = True  # at the start of the thinking text (leading whitespace dropped)
        self.reasoning = []

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        think, content = [], []
        while self.buf:
            if self.state == "start":
                s = self.buf.lstrip()
                if not s:
                    break
                if s.startswith(OPEN):
                    self.buf, self.state = s[len(OPEN):], "think"
                    continue
                if OPEN.startswith(s):
                    break  # may still become <think>
                self.state = "answer"
            if self.state == "answer":
                content.append(self.buf)
                self.buf = ""
                break
            if self.state == "after":  # whitespace after </think> belongs to neither
                self.buf = self.buf.lstrip()
                if self.buf:
                    self.state = "answer"
                continue
            # thinking
            if self.fresh:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self.fresh = False
            end = self.buf.find(CLOSE)
            if end >= 0:
                think.append(self.buf[:end].rstrip())
                self.buf, self.state = self.buf[end + len(CLOSE):], "after"
                continue
            keep = _partial(self.buf, CLOSE)
            body = self.buf[: len(self.buf) - keep]
            ws = len(body) - len(body.rstrip())  # held: it is dropped if </think> follows
            think.append(body[: len(body) - ws])
            self.buf = self.buf[len(body) - ws:]
            break
        r = "".join(think)
        self.reasoning.append(r)
        return r, "".join(content)

    def flush(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state == "think":
            return rest.rstrip(), ""
        if self.state == "start":
            return "", rest if rest.strip() else ""
        return "", "" if self.state == "after" else rest


def _partial(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
