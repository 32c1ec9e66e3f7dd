"""``localflash run``: one prompt, the text on stdout, the summary on stderr."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from localflash.cli.app import app, fail
from localflash.cli.options import MAX_TOKENS, RAW, SYSTEM, LoadFlags, SamplingFlags, shared_options, use


@app.command()
@shared_options
def run(
    prompt: str = typer.Argument(..., help="The prompt (use - to read it from stdin)."),
    load: LoadFlags = use(),
    max_tokens: int = MAX_TOKENS.option(256),
    sampling: SamplingFlags = use(),
    raw: bool = RAW.option(),
    system: Optional[str] = SYSTEM.option(),
    json_out: bool = typer.Option(False, "--json", help="Print the statistics as JSON on stderr at the end."),
    grammar_file: Optional[str] = typer.Option(None, "--grammar-file", help="A GBNF grammar file the reply must follow (llama.cpp's format)."),
    json_schema: Optional[str] = typer.Option(None, "--json-schema", help="A JSON schema (inline JSON or a file) the reply must be an instance of."),
):
    """Generate text from a prompt; text on stdout, the summary on stderr."""
    from localflash.api import STOP_REASONS, open_llm
    from localflash.errors import ContextOverflow

    if prompt == "-":
        prompt = sys.stdin.read()
    params = sampling.params()
    constraint = _constraint(grammar_file, json_schema)
    cfg = load.config()
    with open_llm(cfg) as llm:
        n_ctx = llm.n_ctx
        rounded = ""
        if cfg.ctx < n_ctx:
            rounded = f" (-c {cfg.ctx} rounded up: llama.cpp sizes the context in blocks of 256 tokens)"
        elif cfg.ctx > n_ctx:
            rounded = f" (asked {cfg.ctx}: the largest that fits in memory)"
        try:
            chunks = llm.stream(prompt, raw=raw, system=system or None, max_tokens=max_tokens, sampling=params, **constraint)
        except ContextOverflow as e:
            fail(f"the prompt has {e.prompt_tokens} tokens but the context holds {n_ctx}{rounded}: no room to generate",
                 hint=f"raise -c/--ctx above {e.prompt_tokens} or shorten the prompt")
        if rounded:
            typer.echo(f"note: context {n_ctx} tokens{rounded}", err=True)
        out = sys.stdout
        for chunk in chunks:
            out.write(chunk.text)
            out.flush()
        out.write("\n")
        out.flush()
        stats = chunk.stats
        typer.echo(stats.summary(), err=True)
        note = llm.acceptance_note(stats)
        if note:
            typer.echo(f"warning: {note}", err=True)
        off = llm.off_reason()
        if off:
            typer.echo(off, err=True)
        if stats.stop == "context":
            typer.echo(f"stopped: the context is full at {n_ctx} tokens; raise -c/--ctx for a longer reply", err=True)
        elif stats.stop == "eog" and not stats.generated:
            typer.echo("note: the model ended its reply at once (its first token was end-of-generation)", err=True)
        elif stats.stop not in ("eog", "length"):
            typer.echo(f"stopped: {STOP_REASONS.get(stats.stop, stats.stop)}", err=True)
        if json_out:
            import json

            typer.echo(json.dumps(stats.to_dict() | {"n_ctx": n_ctx}), err=True)


def _constraint(grammar_file: str | None, json_schema: str | None) -> dict:
    """--grammar-file / --json-schema -> LLM.start's ``grammar`` / ``json_schema`` keyword (checked there, before decoding)."""
    import json
    from pathlib import Path

    if grammar_file and json_schema:
        fail("pass --grammar-file or --json-schema, not both")
    if grammar_file:
        try:
            return {"grammar": Path(grammar_file).read_text(encoding="utf-8")}
        except OSError as e:
            fail(f"cannot read --grammar-file {grammar_file}: {e.strerror or e}")
    if json_schema:
        text = json_schema
        if not json_schema.lstrip().startswith(("{", "[")) and json_schema not in ("true", "false"):
            try:
                text = Path(json_schema).read_text(encoding="utf-8")
            except OSError as e:
                fail(f"cannot read --json-schema {json_schema}: {e.strerror or e}", hint="pass a schema file or inline JSON")
        try:
            return {"json_schema": json.loads(text)}
        except json.JSONDecodeError as e:
            fail(f"--json-schema is not valid JSON: {e}")
    return {}
