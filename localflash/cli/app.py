"""The ``localflash`` Typer app: its callback, :func:`fail` and the console entry point :func:`main`.

Each command lives in its own module (``cli/run.py``, ``cli/chat.py``, ...), which
registers itself on :data:`app`; ``localflash/cli/__init__.py`` imports them all.
Heavy imports happen inside the commands, so ``--help`` stays instant.
"""

from __future__ import annotations

import sys
import traceback

import typer

from localflash.errors import LocalflashError

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
        from localflash.api import set_verbose

        set_verbose(True)


def fail(message: str, hint: str | None = None, code: int = 1):
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


def main() -> None:
    """Console entry point: user errors become one line and a non-zero exit."""
    try:
        rc = app(standalone_mode=False)  # click returns typer.Exit's code here instead of exiting
        if isinstance(rc, int) and rc:
            sys.exit(rc)
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
        # typer ships its own copy of click (typer._click), so match by shape, not by class
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        if _state["verbose"]:
            raise
        typer.echo(f"error: {type(e).__name__}: {e}", err=True)
        typer.echo("hint: run with --verbose for the full traceback", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
