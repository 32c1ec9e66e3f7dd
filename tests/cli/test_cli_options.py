"""Shared options are defined once: the same flag means the same in every command, and a new command reuses them."""

from __future__ import annotations

from typing import Optional

import typer
from typer.main import get_command
from typer.testing import CliRunner

from localflash import cli
from localflash.cli.options import LoadFlags, SamplingFlags, shared_options, use


def _options(command_name: str) -> dict[str, tuple[str, object]]:
    """``--flag`` -> (help, default) of one command."""
    cmd = get_command(cli.app).commands[command_name]
    out = {}
    for p in cmd.params:
        for name in p.opts:
            if name.startswith("--"):
                out[name] = (p.help, p.default)
    return out


def test_a_flag_has_one_help_text_in_every_command():
    commands = {name: _options(name) for name in ("run", "chat", "bench", "plan")}
    seen: dict[str, dict[str, str]] = {}
    for name, opts in commands.items():
        for flag, (help_text, _) in opts.items():
            if flag not in ("--json", "--help", "--ctx", "--kv"):  # plan's --ctx/--kv and the --json outputs mean other things
                seen.setdefault(flag, {})[name] = help_text
    drifted = {flag: helps for flag, helps in seen.items() if len(set(helps.values())) > 1}
    assert not drifted
    shared = {flag for flag, helps in seen.items() if len(helps) >= 3}
    assert {"--model", "--pair", "--drafter", "--draft-max", "--fixed", "--threads", "--n-gpu-layers",
            "--temp", "--top-k", "--top-p", "--min-p", "--seed", "--max-tokens"} <= shared
    assert all(help_text for helps in seen.values() for help_text in helps.values())  # no flag without a help text


def test_commands_keep_their_own_defaults():
    run, chat, bench = (_options(n) for n in ("run", "chat", "bench"))
    assert run["--temp"][1] == 0.0 and chat["--temp"][1] == 0.8
    assert run["--top-p"][1] == 1.0 and chat["--top-p"][1] == 0.95 and chat["--min-p"][1] == 0.05
    assert (run["--max-tokens"][1], chat["--max-tokens"][1], bench["--max-tokens"][1]) == (256, 1024, 128)
    assert "--spec" in run and "--spec" not in bench  # bench picks modes with --modes


def test_a_new_command_reuses_the_model_flags_in_two_lines(tiny_target):
    app = typer.Typer()
    got = {}

    @app.command()
    @shared_options
    def serve(load: LoadFlags = use(), sampling: SamplingFlags = use(temp=0.7), port: int = 8000, name: Optional[str] = None):
        got.update(cfg=load.config(), params=sampling.params(), port=port)

    r = CliRunner().invoke(app, ["-m", str(tiny_target), "-c", "512", "--spec", "ngram", "--draft-max", "4", "--fixed",
                                 "-t", "1", "--top-k", "5", "--port", "9"])
    assert r.exit_code == 0, r.output
    cfg = got["cfg"]
    assert (str(cfg.target), cfg.ctx, cfg.spec, cfg.draft_max, cfg.adaptive, cfg.threads) == (str(tiny_target), 512, "ngram", 4, False, 1)
    assert (got["params"].temperature, got["params"].top_k, got["port"]) == (0.7, 5, 9)
    helped = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--n-gpu-layers" in helped and "Target GGUF file." in helped and "0.7" in helped
