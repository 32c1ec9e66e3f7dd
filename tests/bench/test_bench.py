"""``localflash bench``: every mode measured, numbers consistent with counts, verdict saved and used."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localflash.bench.prompts import load_prompts
from localflash.bench.run import COUNTS
from localflash.bench.verdicts import load_verdict, pair_key, verdict_path
from localflash.errors import LocalflashError

PROMPTS = [
    {"id": "c1", "category": "code", "prompt": "def fib(n):\n    # return the n-th Fibonacci number\n"},
    {"id": "c2", "category": "code", "prompt": "Write a function that reverses a list in Python."},
    {"id": "t1", "category": "talk", "turns": ["Tell me about the sea.", "And the sky?"]},
    {"id": "t2", "category": "talk", "messages": [{"role": "user", "content": "What is a lighthouse?"}]},
]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    return path


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_bench_json_has_every_mode_and_numbers_follow_from_counts(lf, lf_env, tiny_target, tiny_drafters, prompt_file, tmp_path):
    user_toml = tmp_path / "xdg" / "config" / "localflash" / "models.toml"
    user_toml.parent.mkdir(parents=True)
    user_toml.write_text(
        f'[pairs.tiny-draft]\ntarget = "{tiny_target}"\ndrafter = "{tiny_drafters["same"]}"\nkind = "draft"\ndraft_max = 4\nctx = 1024\n'
    )
    out = tmp_path / "bench.json"
    r = lf(
        "bench", "--pair", "tiny-draft", "--modes", "none,ngram,draft", "--prompts", prompt_file, "-n", "20",
        "-t", "1", "--fixed", "--draft-max", "4", "--json", out, "--watts", "200", "--price-kwh", "0.4",
    )
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and "verdict:" in r.stdout and "drafts accepted per cycle" in r.stdout
    assert "kWh / Mtok" in r.stdout and "peak memory" in r.stdout
    rep = json.loads(out.read_text())

    assert rep["modes"] == ["none", "ngram", "draft"]
    assert rep["prompts"]["categories"] == ["code", "talk"] and rep["prompts"]["n"] == 4
    assert len(rep["runs"]) == 12 and {(x["prompt"], x["mode"]) for x in rep["runs"]} == {
        (p["id"], m) for p in PROMPTS for m in rep["modes"]
    }
    for mode in rep["modes"]:
        res = rep["results"][mode]
        scopes = {c: res["categories"][c] for c in ("code", "talk")} | {"all": res["all"]}
        for scope, row in scopes.items():
            runs = [x for x in rep["runs"] if x["mode"] == mode and scope in ("all", x["category"])]
            for c in COUNTS:
                assert row[c] == sum(x[c] for x in runs), (mode, scope, c)
            assert _close(row["t_decode"], sum(x["t_decode"] for x in runs))
            assert _close(row["tok_s"], row["generated"] / row["t_decode"])
            plain = rep["results"]["none"]["all"] if scope == "all" else rep["results"]["none"]["categories"][scope]
            assert _close(row["speedup"], row["tok_s"] / plain["tok_s"])
            assert _close(row["tau"], row["committed"] / row["cycles"])
            assert _close(row["acceptance"], row["accepted"] / row["drafted"] if row["drafted"] else 0.0)
            assert sum(row["accept_hist"]) == row["cycles"]
            assert row["same_as_plain"] == sum(x["same_as_plain"] for x in runs) == len(runs)  # temp 0: lossless
            assert _close(row["kwh_per_mtok"], 200 * 1e6 / row["tok_s"] / 3.6e6)
            assert _close(row["cost_per_mtok"], row["kwh_per_mtok"] * 0.4)
    plain, draft = rep["results"]["none"]["all"], rep["results"]["draft"]["all"]
    assert plain["drafted"] == 0 and plain["committed"] == plain["cycles"] and plain["speedup"] == 1.0
    # a drafter with the target's own weights, 4 drafts every cycle: nearly all accepted
    assert draft["drafted"] > 0 and draft["acceptance"] > 0.5 and draft["tau"] > 1.5
    assert len(draft["position_acceptance"]) == 4
    assert rep["peak_rss_bytes"] > 0

    # the verdict: saved per rig + pair, read back, listed by `models`, used by `chat --draft auto`
    v = rep["verdict"]
    assert verdict_path().exists()
    assert load_verdict(rep["rig"]["name"], pair_key(tiny_target, tiny_drafters["same"])) == v
    assert v["pair"] == "tiny-draft" and set(v["modes"]) == {"ngram", "draft"}
    assert v["modes"]["draft"]["speedup"] == draft["speedup"]
    best = max(v["modes"], key=lambda m: v["modes"][m]["speedup"])
    assert v["best"] == (best if v["modes"][best]["speedup"] >= 1.03 else "none")
    listed = json.loads(lf("models", "--json").stdout)
    assert next(p for p in listed if p["name"] == "tiny-draft")["verdict"] == v["text"]
    chat = lf("chat", "--pair", "tiny-draft", "-n", "4", "-t", "1", input="hi\n")
    assert chat.returncode == 0, chat.stderr
    speedup = v["modes"]["draft"]["speedup"]
    assert f"bench verdict on this rig: draft {speedup:.2f}× plain → drafting starts {'on' if speedup >= 1 else 'off'}" in chat.stderr


def test_bench_detects_a_dflash_drafter_and_no_save_keeps_no_verdict(lf, tiny_target, tiny_dflash, prompt_file, tmp_path):
    out = tmp_path / "b.json"
    r = lf("bench", "-m", tiny_target, "--drafter", tiny_dflash, "--prompts", prompt_file, "--limit", "1",
           "-n", "12", "-t", "1", "--repeat", "2", "--json", out, "--no-save")
    assert r.returncode == 0, r.stderr
    assert "best of 2" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["modes"] == ["none", "dflash"] and rep["prompts"]["n"] == 2  # one prompt per category
    assert rep["settings"]["repeat"] == 2 and len(rep["runs"]) == 4  # the fastest of two runs per prompt and mode
    assert rep["results"]["dflash"]["all"]["same_as_plain"] == 2
    assert not verdict_path().exists()


def test_bench_runs_lookup_first_dflash_as_its_own_mode(lf, tiny_target, tiny_dflash, prompt_file, tmp_path):
    out = tmp_path / "b.json"
    r = lf("bench", "-m", tiny_target, "--drafter", tiny_dflash, "--modes", "dflash,dflash+ngram", "--prompts", prompt_file,
           "--limit", "1", "-n", "12", "-t", "1", "--json", out, "--no-save")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["modes"] == ["none", "dflash", "dflash+ngram"]
    assert rep["results"]["dflash+ngram"]["all"]["same_as_plain"] == 2


def test_a_users_prompt_file_runs_in_full_unless_limit_says_otherwise(lf, tiny_target, tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n" for i in range(8)))
    for extra, n in (([], 8), (["--limit", "2"], 2)):
        r = lf("bench", "-m", tiny_target, "--modes", "none", "--prompts", mine, "-n", "2", "-t", "1", "--raw",
               "--json", "-", "--no-save", *extra)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["prompts"]["n"] == n, extra


def test_bench_json_to_stdout_is_pure_json(lf, tiny_target, prompt_file):
    r = lf("bench", "-m", tiny_target, "--prompts", prompt_file, "--limit", "1", "-n", "8", "-t", "1", "--json", "-", "--no-save")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["modes"] == ["none", "ngram"] and "verdict:" in r.stderr


def test_prompt_sets_ship_with_the_package():
    name, sb = load_prompts("spec_bench", 2)
    cats = list(dict.fromkeys(p.category for p in sb))
    assert name == "spec_bench" and len(cats) == 13 and len(sb) == 26
    assert {"writing", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"} <= set(cats)
    first = sb[0]
    assert first.id == "81" and first.text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    _, he = load_prompts("humaneval", 3)
    assert [p.id for p in he] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in he[0].text and he[0].text.startswith("Write a solution")
    _, everything = load_prompts("humaneval")
    assert len(everything) == 164


def test_prompt_set_errors_are_one_clear_line(tmp_path, monkeypatch):
    from localflash.bench import prompts as bench

    monkeypatch.setitem(bench.PROMPT_SET_FILES, "spec_bench", "absent.jsonl.gz")  # a broken install
    with pytest.raises(LocalflashError) as e:
        load_prompts("spec_bench")
    assert "prompt set file not found" in e.value.message and "--prompts FILE.jsonl" in e.value.hint
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(LocalflashError, match=r"bad.jsonl:2: not JSON"):
        load_prompts(str(bad))
    empty = tmp_path / "noprompt.jsonl"
    empty.write_text('{"category": "x", "answer": 3}\n')
    with pytest.raises(LocalflashError, match=r"noprompt.jsonl:1: no prompt"):
        load_prompts(str(empty))
    with pytest.raises(LocalflashError, match="neither a prompt set nor a file"):
        load_prompts("no_such_set")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--price-kwh", "0.3"], "--price-kwh needs --watts"),
        (["--watts", "0"], "--watts must be positive"),
        (["--modes", "none,warp"], "unknown bench mode 'warp'"),
        (["--modes", "dflash"], "bench mode dflash needs a drafter"),
        (["--modes", "dflash+ngram"], "bench mode dflash+ngram needs a drafter"),
        (["--limit", "-1"], "--limit must be 0 (all) or more"),
        (["--repeat", "0"], "--repeat must be in 1..100"),
        (["--prompts", "spec_bench", "-n", "0"], "--max-tokens must be at least 1"),
    ],
)
def test_bench_flag_errors(lf, tiny_target, prompt_file, args, message):
    r = lf("bench", "-m", tiny_target, "--prompts", prompt_file, "-t", "1", *args)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]


def test_bench_parallel_reports_aggregate_throughput_per_mode(lf, tiny_target, tiny_dflash, prompt_file):
    r = lf("bench", "-m", tiny_target, "--drafter", tiny_dflash, "--modes", "dflash,ngram", "--prompts", prompt_file, "--limit", "2",
           "-n", "12", "-t", "1", "--parallel", "4", "--json", "-", "--no-save")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["slots"] == 4 and [m["mode"] for m in report["modes"]] == ["none", "dflash", "ngram"]
    for m in report["modes"]:
        assert m["generated"] > 0 and m["aggregate_tok_s"] > 0 and m["per_stream_tok_s"] > 0
        assert m["requests"] == report["modes"][0]["requests"]
    assert "aggregate tok/s" in r.stderr


def test_benchmarks_md_is_what_its_json_and_hand_written_notes_render(tmp_path):
    """docs/benchmarks.md is generated: its tables from benchmarks.json, everything after them from benchmarks.notes.md,
    so a rerun of benchmarks/speed/bench_suite.py keeps every hand-written section (none lives only in the .md)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name in ("benchmarks.json", "benchmarks.notes.md"):
        shutil.copy(docs / name, tmp_path / name)
    script = docs.parent / "benchmarks" / "speed" / "bench_suite.py"
    subprocess.run([sys.executable, str(script), "--render", "--out", str(tmp_path / "benchmarks")], check=True, capture_output=True)
    assert (tmp_path / "benchmarks.md").read_text(encoding="utf-8") == (docs / "benchmarks.md").read_text(encoding="utf-8")
