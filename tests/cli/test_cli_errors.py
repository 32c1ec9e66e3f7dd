"""Every user mistake: one `error:` line (and maybe a hint), a non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from localflash.testing.tiny import TinySpec, write_target


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, tiny_target) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    data = tiny_target.read_bytes()
    (d / "half.gguf").write_bytes(data[: len(data) // 2])  # tensor data cut short
    (d / "stub.gguf").write_bytes(data[:100])  # header cut short
    (d / "notes.gguf").write_text("these are notes, not a model\n")
    return {
        "half": d / "half.gguf",
        "stub": d / "stub.gguf",
        "text": d / "notes.gguf",
        "renamed": write_target(d / "renamed.gguf", TinySpec(n_layer=2, seed=0, rename_tokens=True)),
        "missing": d / "absent.gguf",
    }


LONG = "word " * 400  # ~400 tokens


def _check_one_line(case: str, code: int, out: str, err: str, message: str) -> None:
    assert code == 1, (case, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], (case, err)
    assert all(ln.startswith(("error:", "hint:")) for ln in lines), (case, err)
    assert out == ""


# Files reach llama.cpp (whose C-side log must stay quiet), so these run as real processes.
@pytest.mark.parametrize(
    "case, args, message",
    [
        ("missing file", ["run", "-m", "{missing}", "hi"], "model file not found: {missing}"),
        ("missing file (chat)", ["chat", "-m", "{missing}"], "model file not found: {missing}"),
        ("missing file (bench)", ["bench", "-m", "{missing}", "--prompts", "humaneval"], "model file not found: {missing}"),
        ("not GGUF", ["run", "-m", "{text}", "hi"], "not a GGUF file: {text}"),
        ("truncated tensors", ["run", "-m", "{half}", "hi"], "half.gguf"),
        ("truncated header", ["chat", "-m", "{stub}"], "stub.gguf"),
        ("incompatible pair", ["run", "-m", "{target}", "--drafter", "{renamed}", "--spec", "draft", "hi"], "different tokenizers"),
        ("prompt over context", ["run", "-m", "{target}", "-c", "256", "--raw", LONG], "but the context holds 256"),
        ("prompt over a rounded context", ["run", "-m", "{target}", "-c", "16", "--raw", LONG],
         "but the context holds 256 (-c 16 rounded up: llama.cpp sizes the context in blocks of 256 tokens): no room to generate"),
        ("bad kv type", ["run", "-m", "{target}", "--kv", "q3", "hi"], "q3"),
        ("drafter as target", ["run", "-m", "{dflash}", "hi"], "dflash.gguf is a DFlash drafter, not a target"),
        ("drafter as target (chat)", ["chat", "-m", "{dflash}"], "dflash.gguf is a DFlash drafter, not a target"),
        ("drafter as target (plan)", ["plan", "-m", "{dflash}"], "dflash.gguf is a DFlash drafter, not a target"),
        ("full layers without a window", ["train-drafter", "--target", "{target}", "--prompts", "{target}", "--out", "{missing}",
                                          "--full-layers", "1"], "needs --sliding-window"),
    ],
)
def test_file_mistakes_are_one_line(lf, bad_files, tiny_target, tiny_dflash, case, args, message):
    names = {k: str(v) for k, v in bad_files.items()} | {"target": str(tiny_target), "dflash": str(tiny_dflash)}
    r = lf(*[a.format(**names) for a in args], input="")
    _check_one_line(case, r.returncode, r.stdout, r.stderr, message.format(**names))
    if case.startswith("drafter as target"):
        assert "hint: pass it with --drafter next to its target" in r.stderr
    if case.startswith("truncated"):  # refused by the GGUF header reader or by llama.cpp's loader
        assert "not a readable GGUF file" in r.stderr or "could not load" in r.stderr, r.stderr


# Flag and name mistakes: the same entry point (`localflash.cli.main`), in this process.
@pytest.mark.parametrize(
    "case, args, message",
    [
        ("unknown pair", ["run", "--pair", "nope", "hi"], "unknown pair 'nope'"),
        ("unknown pair (chat)", ["chat", "--pair", "nope"], "unknown pair 'nope'"),
        ("unknown pair (bench)", ["bench", "--pair", "nope"], "unknown pair 'nope'"),
        ("unknown pair (check)", ["models", "check", "nope"], "unknown pair 'nope'"),
        ("temp < 0", ["run", "-m", "{target}", "--temp", "-1", "hi"], "--temp must be >= 0"),
        ("top-p > 1", ["chat", "-m", "{target}", "--top-p", "2"], "--top-p must be in (0, 1]"),
        ("ctx too small", ["run", "-m", "{target}", "-c", "8", "hi"], "-c/--ctx must be at least 16"),
        ("draft-max too big", ["run", "-m", "{target}", "--draft-max", "99", "hi"], "--draft-max must be in 0..64"),
        ("max-tokens 0", ["chat", "-m", "{target}", "-n", "0"], "--max-tokens must be at least 1"),
        ("bad --draft", ["chat", "-m", "{target}", "--draft", "maybe"], "--draft must be on, off or auto"),
        ("bad --spec", ["run", "-m", "{target}", "--spec", "warp", "hi"], "unknown --spec 'warp'"),
        ("no model", ["chat"], "name a model"),
    ],
)
def test_flag_mistakes_are_one_line(lf_env, monkeypatch, capsys, tiny_target, case, args, message):
    import io
    import sys

    from localflash import cli

    monkeypatch.setattr(sys, "argv", ["localflash", *[a.format(target=tiny_target) for a in args]])
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    out, err = capsys.readouterr()
    _check_one_line(case, exit_.value.code, out, err, message)


def test_bad_user_models_toml_names_its_line(lf, lf_env):
    user = Path(lf_env["XDG_CONFIG_HOME"]) / "localflash" / "models.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[pairs.mine]\ntarget = "a.gguf"\ndraft_max = \n')
    r = lf("models")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: {user}: bad TOML") and "line 3" in r.stderr.splitlines()[0]


def test_verbose_shows_the_traceback(lf, bad_files):
    r = lf("--verbose", "run", "-m", bad_files["missing"], "hi")
    assert r.returncode == 1 and "Traceback" in r.stderr and "LocalflashError" in r.stderr


def test_usage_errors_exit_2(lf):
    r = lf("run", "--temp", "warm", "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--temp" in r.stderr
