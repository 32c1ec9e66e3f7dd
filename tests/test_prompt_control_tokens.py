"""Detokenizing: control tokens that mark tool calls or thinking are written out, other control tokens stay silent."""

from __future__ import annotations

from localflash.llama import Model, ModelOptions
from localflash.prompt import KEPT_CONTROL, TextStream


class _Renamed:
    """The tiny model with one control token's text changed (the tiny vocab has no tool-call tokens)."""

    def __init__(self, model, token: int, text: str):
        self.model, self.token, self.text = model, token, text

    def piece(self, t: int) -> bytes:
        return self.model.piece(t)

    def token_text(self, t: int) -> str:
        return self.text if t == self.token else self.model.token_text(t)


def test_a_control_token_that_marks_a_call_is_written_and_others_are_not(tiny_target):
    model = Model(str(tiny_target), ModelOptions(n_gpu_layers=0, vocab_only=True))
    try:
        words = model.tokenize("Hi there", add_special=False)
        plain = TextStream(model).push(words)
        assert model.piece(model.eos) == b""  # llama.cpp prints control tokens as nothing
        assert TextStream(model).push([model.eos, *words]) == plain  # </s> is not a marker: still nothing
        assert "[TOOL_CALLS]" in KEPT_CONTROL and "<|python_tag|>" in KEPT_CONTROL
        assert TextStream(_Renamed(model, model.eos, "[TOOL_CALLS]")).push([model.eos, *words]) == "[TOOL_CALLS]" + plain
    finally:
        model.close()
