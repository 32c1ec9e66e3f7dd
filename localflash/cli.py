"""The localflash command line. Heavy imports happen inside commands so --help is instant."""

from __future__ import annotations

import sys
import traceback
from typing import Optional

import typer

from .errors import LocalflashError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Speculative decoding for quantized GGUF models: DFlash, draft models, n-gram lookup.",
)

_state = {"verbose": False}


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show llama.cpp's log and full tracebacks.")):
    _state["verbose"] = verbose
    if verbose:
        from .llama import set_verbose

        set_verbose(True)


def fail(message: str, hint: str | None = None, code: int = 1):
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


def sampling_from(temp: float, top_k: int, top_p: float, min_p: float, seed: Optional[int]):
    from .speculative.sampling import SamplingParams

    return SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)


@app.command()
def run(
    prompt: str = typer.Argument(..., help="The prompt (use - to read it from stdin)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Target GGUF file."),
    pair: Optional[str] = typer.Option(None, "--pair", "-p", help="A pair from models.toml."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Drafter GGUF (DFlash or a small model)."),
    spec: str = typer.Option("auto", "--spec", help="auto | none | dflash | draft | ngram."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="Longest draft per cycle."),
    fixed: bool = typer.Option(False, "--fixed", help="Always draft --draft-max tokens (no adaptive length)."),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", help="Tokens to generate."),
    ctx: Optional[int] = typer.Option(None, "--ctx", "-c", help="Context size in tokens."),
    temp: float = typer.Option(0.0, "--temp", help="Temperature; 0 is greedy."),
    top_k: int = typer.Option(40, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    min_p: float = typer.Option(0.0, "--min-p"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt (chat template only)."),
    threads: int = typer.Option(0, "--threads", "-t", help="CPU threads (0: automatic)."),
    n_gpu_layers: int = typer.Option(-1, "--n-gpu-layers", "-ngl", help="Target layers on the GPU (-1: all)."),
    kv: Optional[str] = typer.Option(None, "--kv", help="KV cache type: f16, q8_0, q4_0."),
    json_out: bool = typer.Option(False, "--json", help="Print the statistics as JSON on stderr at the end."),
):
    """Generate text from a prompt; text on stdout, the summary on stderr."""
    from .prompt import TextStream, render_chat, tokenize_prompt
    from .runner import config_from, open_engine
    from .speculative.stats import Stats

    if max_tokens < 1:
        fail(f"--max-tokens must be at least 1, got {max_tokens}")
    if prompt == "-":
        prompt = sys.stdin.read()
    sampling = sampling_from(temp, top_k, top_p, min_p, seed)
    cfg = config_from(
        pair, model, drafter, spec=spec, draft_max=draft_max, ctx=ctx, threads=threads,
        n_gpu_layers=n_gpu_layers, kv=kv, adaptive=not fixed,
    )
    engine = open_engine(cfg)
    try:
        target = engine.target
        if raw or not target.chat_template():
            tokens = target.tokenize(prompt, add_special=True, parse_special=False)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            tokens = tokenize_prompt(target, render_chat(target, messages))
        stream = TextStream(target)
        stats = Stats()
        out = sys.stdout
        for new in engine.generate(tokens, max_tokens, sampling, stats):
            out.write(stream.push(new))
            out.flush()
        out.write(stream.flush() + "\n")
        out.flush()
        typer.echo(stats.summary(), err=True)
        if json_out:
            import json

            typer.echo(json.dumps(stats.to_dict()), err=True)
    finally:
        engine.close()


def main() -> None:
    """Console entry point: user errors become one line and a non-zero exit."""
    try:
        app(standalone_mode=False)
    except LocalflashError as e:
        if _state["verbose"]:
            traceback.print_exc()
        typer.echo(f"error: {e.message}", err=True)
        if e.hint:
            typer.echo(f"hint: {e.hint}", err=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        sys.exit(130)
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if _state["verbose"]:
            raise
        typer.echo(f"error: {type(e).__name__}: {e}", err=True)
        typer.echo("hint: run with --verbose for the full traceback", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
