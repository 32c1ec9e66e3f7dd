"""Chat templates from the GGUF (Jinja2, sandboxed) and streaming-safe detokenization."""

from __future__ import annotations

import codecs

from .errors import LocalflashError


def render_chat(model, messages: list[dict], add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
    """Apply the model's own chat template to ``messages``."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = model.chat_template()
    if not source:
        raise LocalflashError(f"{model.path.name} has no chat template", hint="use --raw to send the prompt as plain text")

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    extra = {} if thinking is None else {"enable_thinking": thinking}
    try:
        return env.from_string(source).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=model.token_text(model.bos) if model.bos >= 0 else "",
            eos_token=model.token_text(model.eos) if model.eos >= 0 else "",
            **extra,
        )
    except TemplateError as e:
        raise LocalflashError(f"the chat template of {model.path.name} failed: {e}") from e


def supports_thinking(model) -> bool:
    src = model.chat_template() or ""
    return "enable_thinking" in src or "<think>" in src


def tokenize_prompt(model, text: str) -> list[int]:
    """Tokenize a rendered prompt without doubling a BOS the template already wrote."""
    bos_text = model.token_text(model.bos) if model.bos >= 0 else ""
    add_bos = model.add_bos and not (bos_text and text.startswith(bos_text))
    tokens = model.tokenize(text, add_special=add_bos, parse_special=True)
    return tokens


class TextStream:
    """Token ids in, complete UTF-8 text out (a character split over tokens waits for its end)."""

    def __init__(self, model):
        self.model = model
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tokens) -> str:
        return self.decoder.decode(b"".join(self.model.piece(int(t)) for t in tokens))

    def flush(self) -> str:
        return self.decoder.decode(b"", final=True)
