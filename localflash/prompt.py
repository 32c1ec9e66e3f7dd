"""Chat templates from the GGUF (Jinja2, sandboxed) and streaming-safe detokenization."""

from __future__ import annotations

import codecs
import functools
import json

from localflash.errors import LocalflashError


def render_chat(
    model, messages: list[dict], add_generation_prompt: bool = True, thinking: bool | None = None, tools: list[dict] | None = None
) -> str:
    """Apply the model's own chat template to ``messages`` (OpenAI-style: tool calls and tool results too).

    ``tools`` (OpenAI function specs) go to the template as ``tools``, as Hugging Face
    passes them; a template that never reads ``tools`` ignores them.
    """
    from jinja2 import TemplateError

    source = model.chat_template()
    if not source:
        raise LocalflashError(f"{model.path.name} has no chat template", hint="use --raw to send the prompt as plain text")
    try:
        template = _compiled(source)
    except TemplateError as e:
        raise LocalflashError(f"the chat template of {model.path.name} failed: {e}") from e
    extra = {} if thinking is None else {"enable_thinking": thinking}
    if tools:
        extra["tools"] = tools
    def render(object_arguments: bool) -> str:
        return template.render(
            messages=[template_message(m, object_arguments) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=model.token_text(model.bos) if model.bos >= 0 else "",
            eos_token=model.token_text(model.eos) if model.eos >= 0 else "",
            **extra,
        )

    try:
        try:
            return render(True)
        except TypeError:
            if not any(m.get("tool_calls") for m in messages if isinstance(m, dict)):
                raise
            # templates that add the arguments to a string (DeepSeek R1's) take them as JSON text
            return render(False)
    except TemplateError as e:
        raise LocalflashError(f"the chat template of {model.path.name} failed: {e}") from e
    except (TypeError, ValueError, AttributeError, KeyError) as e:  # a message the template cannot take
        raise LocalflashError(f"the chat template of {model.path.name} cannot render these messages: {e}") from e


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    """The template compiled once per source text: a Qwen chat template takes tens of milliseconds to compile,
    which every request paid before its first token (rendering a compiled template is thread-safe)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson  # Hugging Face's: plain json.dumps, no HTML escaping
    return env.from_string(source)


def template_message(m: dict, object_arguments: bool = True) -> dict:
    """One OpenAI-style message as chat templates expect it: the one rendering the API and the server share.

    - role ``developer`` (OpenAI's newer name for ``system``) becomes ``system``;
    - ``content`` None or left out (an assistant turn that only calls tools) becomes "";
      a list of content parts becomes its text parts joined with a newline, as llama.cpp's
      server does (``common_chat_msgs_to_json_oaicompat``: a newline between text parts,
      other part types dropped);
    - keys set to None are left out, as if the client had not sent them;
    - tool-call ``arguments`` given as JSON text of an object become that object (templates
      print it with ``tojson``, as llama.cpp and Hugging Face do); empty text is ``{}``;
      anything else stays as given. With ``object_arguments`` False they stay JSON text (for a
      template that joins them to a string, as DeepSeek R1's does; ``render_chat`` retries so).
    """
    out = {k: v for k, v in m.items() if v is not None}
    if out.get("role") == "developer":
        out["role"] = "system"
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        text = ""
        for part in content:
            if isinstance(part, dict) and part.get("type", "text") == "text":
                piece = part.get("text") or ""
                text = f"{text}\n{piece}" if text else piece
        out["content"] = text
    if out.get("tool_calls"):
        out["tool_calls"] = [_template_call(c) if object_arguments else _text_call(c) for c in out["tool_calls"]]
    return out


def _template_call(call):
    if not isinstance(call, dict):
        return call
    call = {k: v for k, v in call.items() if v is not None}
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        args = fn["arguments"]
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError:
            parsed = None  # not JSON: the template gets the text as is
        if isinstance(parsed, dict):
            call["function"] = {**fn, "arguments": parsed}
    return call


def _text_call(call):
    if not isinstance(call, dict):
        return call
    call = {k: v for k, v in call.items() if v is not None}
    fn = call.get("function")
    if isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
        call["function"] = {**fn, "arguments": json.dumps(fn.get("arguments") or {}, ensure_ascii=False)}
    return call


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(fmt)


def supports_thinking(model) -> bool:
    src = model.chat_template() or ""
    return "enable_thinking" in src or "<think>" in src


def tokenize_prompt(model, text: str) -> list[int]:
    """Tokenize a rendered prompt without doubling a BOS the template already wrote."""
    bos_text = model.token_text(model.bos) if model.bos >= 0 else ""
    add_bos = model.add_bos and not (bos_text and text.startswith(bos_text))
    tokens = model.tokenize(text, add_special=add_bos, parse_special=True)
    return tokens


# Control tokens that mark a tool call or a thinking block: llama.cpp detokenizes control tokens to
# nothing, so these are written out as their text, for the server's parsers (llama-server keeps them
# as "preserved tokens" the same way). Mistral, Llama 3.x and DeepSeek mark calls with such tokens.
KEPT_CONTROL = frozenset({
    "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
})


class TextStream:
    """Token ids in, complete UTF-8 text out (a character split over tokens waits for its end)."""

    def __init__(self, model):
        self.model = model
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.kept: dict[int, bytes] = {}

    def push(self, tokens) -> str:
        return self.decoder.decode(b"".join(self._piece(int(t)) for t in tokens))

    def _piece(self, t: int) -> bytes:
        b = self.model.piece(t)
        if b:
            return b
        if t not in self.kept:  # a control token: llama.cpp prints it as nothing, unless it carries a call
            text = self.model.token_text(t)
            self.kept[t] = text.encode() if text in KEPT_CONTROL else b""
        return self.kept[t]

    def flush(self) -> str:
        return self.decoder.decode(b"", final=True)
