"""Every stop that is not end-of-generation or --max-tokens is said: run on stderr, chat as a notice, bench per prompt."""

from __future__ import annotations

import json

from localflash.speculative.stats import STOP_REASONS


def test_run_says_the_context_cut_the_reply_and_which_context_it_used(lf, tiny_target):
    r = lf("run", "-m", tiny_target, "-c", "64", "-n", "500", "--raw", "--spec", "none", "-t", "1", "--json", "one two three")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "note: context 256 tokens (-c 64 rounded up: llama.cpp sizes the context in blocks of 256 tokens)" in lines
    assert "stopped: the context is full at 256 tokens; raise -c/--ctx for a longer reply" in lines
    stats = json.loads(lines[-1])
    assert stats["stop"] == "context" and stats["n_ctx"] == 256
    assert stats["prompt_tokens"] + stats["generated"] == 256 + 1  # the last token is emitted, never cached


def test_run_adds_nothing_when_max_tokens_ends_the_reply(lf, tiny_target):
    r = lf("run", "-m", tiny_target, "-n", "5", "--raw", "--spec", "none", "-t", "1", "--json", "one two three")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stderr.splitlines()[-1])["stop"] == "length"
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith(("stopped:", "note:"))]


def test_chat_says_the_context_cut_the_reply(lf, tiny_target):
    r = lf("chat", "-m", tiny_target, "-c", "64", "-n", "500", "--temp", "0", "--spec", "none", "-t", "1", input="one two three\n")
    assert r.returncode == 0, r.stderr
    assert "reply stopped: the context is full" in r.stdout + r.stderr


def test_bench_json_has_a_stop_reason_per_prompt(lf, tiny_target, tmp_path):
    prompts = tmp_path / "two.jsonl"
    prompts.write_text('{"prompt": "one two three"}\n{"prompt": "four five six"}\n')
    r = lf("bench", "-m", tiny_target, "--modes", "none", "--prompts", prompts, "-c", "256", "-n", "400", "-t", "1",
           "--raw", "--json", "-", "--no-save")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    assert len(runs) == 2 and all(run["stop"] in STOP_REASONS for run in runs)
    assert [run["stop"] for run in runs] == ["context", "context"]  # 400 tokens do not fit in 256
