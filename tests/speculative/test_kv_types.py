"""--kv and --kv-drafter: each cache gets its own type, the planner prices both, and the acceptance guard names a
quantized cache when a run's measured acceptance falls far below its reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localflash.formats.dflash_gguf import DSparkSpec
from localflash.formats.gguf_meta import read_meta
from localflash.plan import Wishes, make_plan
from localflash.plan.devices import HostMemory
from localflash.speculative.stats import Stats, acceptance_guard
from localflash.testing.tiny import TinySpec, write_dspark, write_target

HOST = HostMemory(total=64 << 30, available=64 << 30)


@pytest.fixture(scope="module")
def pair32(tiny_dir):
    """A tiny llama and a DSpark drafter with heads of 32 (a quantized KV cache stores heads in blocks of 32)."""
    t = write_target(tiny_dir / "t32.gguf", TinySpec(n_layer=4, n_head=2, n_head_kv=2, seed=0))
    d = write_dspark(tiny_dir / "d32.gguf", DSparkSpec(n_head=2, n_head_kv=2, target_layers=[1, 2, 3], seed=6), agree_with=t)
    return t, d


def stats(drafted: int, accepted: int, name: str = "dflash") -> Stats:
    st = Stats(drafter=name)
    st.drafted, st.accepted = drafted, accepted
    return st


def test_the_guard_names_the_quantized_cache_and_the_fix_on_an_injected_collapse():
    """No drafter of ours collapses with a q4_0 cache (docs/benchmarks.md, KV types): the collapse is injected here."""
    collapsed = stats(600, 9)  # 1.5%, where the pair expects 60%
    line = acceptance_guard(collapsed, drafter_kv="q4_0", target_kv="f16", expected=0.6)
    assert "1.5%" in line and "q4_0 KV cache" in line and "--kv-drafter f16" in line and "\n" not in line
    line = acceptance_guard(collapsed, drafter_kv="f16", target_kv="q4_0", f16_acceptance=0.55)
    assert "target's q4_0 KV cache" in line and "--kv f16" in line and "with f16 caches 55%" in line
    assert "does not fit" in acceptance_guard(collapsed, expected=0.6)
    assert acceptance_guard(stats(600, 300), drafter_kv="q4_0", expected=0.6) == ""  # 50%: not far below
    assert acceptance_guard(stats(20, 0), drafter_kv="q4_0", expected=0.6) == ""  # too few drafts to judge
    assert acceptance_guard(collapsed, drafter_kv="q4_0") == ""  # no reference: no guess


def test_kv_drafter_sets_the_drafters_cache_type_and_the_plan_prices_both(pair32):
    t, d = (read_meta(p) for p in pair32)
    f16 = make_plan(t, d, [], HOST, Wishes(ctx=2048, kv="f16", drafter_kv="f16"))
    q4 = make_plan(t, d, [], HOST, Wishes(ctx=2048, kv="q8_0", drafter_kv="q4_0"))
    assert (q4.type_k, q4.drafter_type_kv) == ("q8_0", "q4_0")
    assert q4.host.target_kv < f16.host.target_kv and q4.host.drafter_kv < f16.host.drafter_kv
    assert q4.host.drafter_kv == pytest.approx(f16.host.drafter_kv * 18 / 64, rel=0.02)  # q4_0: 18 bytes a block of 32


def test_run_loads_each_cache_with_its_type_and_refuses_heads_not_in_blocks_of_32(lf, pair32, tiny_target, tiny_dflash):
    t, d = pair32
    r = lf("run", "-m", t, "--drafter", d, "--kv", "q8_0", "--kv-drafter", "q4_0", "-n", "8", "-t", "1", "--json", "the river")
    assert r.returncode == 0, r.stderr
    r = lf("plan", "--target", t, "--drafter", d, "--kv", "q8_0", "--kv-drafter", "q4_0", "--json")
    doc = json.loads(r.stdout)
    assert (doc["type_k"], doc["drafter_type_kv"]) == ("q8_0", "q4_0")
    assert doc["runtime_kwargs"]["drafter"]["type_k"] == 2  # GGML_TYPE_Q4_0
    r = lf("run", "-m", tiny_target, "--drafter", tiny_dflash, "--kv-drafter", "q4_0", "-n", "4", "hello")
    assert r.returncode != 0 and "blocks of 32" in r.stderr and "--kv-drafter f16" in r.stderr
    r = lf("run", "-m", t, "--drafter", d, "--kv-drafter", "q3", "-n", "4", "hello")
    assert r.returncode != 0 and "unknown drafter KV cache type" in r.stderr


def test_run_prints_the_guard_line_when_acceptance_is_far_below_the_pairs_expected(lf, lf_env, pair32):
    """The pair's expected acceptance is set far above what this drafter reaches (measured ~16%): an injected collapse."""
    t, d = pair32
    user = Path(lf_env["XDG_CONFIG_HOME"]) / "localflash" / "models.toml"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(f'[pairs.tiny]\ntarget = "{t}"\ndrafter = "{d}"\nkind = "dflash"\nctx = 1024\nacceptance = 0.9\n')
    r = lf("run", "--pair", "tiny", "--kv-drafter", "q4_0", "--fixed", "-n", "96", "-t", "1", "the river a garden of quiet stone")
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "dspark acceptance" in warn[0] and "this pair's expected acceptance 90% (models.toml acceptance of pair tiny)" in warn[0] and "--kv-drafter f16" in warn[0]
    r = lf("run", "--pair", "tiny", "--fixed", "-n", "96", "-t", "1", "the river a garden of quiet stone")
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "does not fit" in warn[0]  # f16 caches: the cause named is the drafter, not a cache


def test_the_shipped_pairs_expect_the_f16_acceptance_measured_in_kv_acceptance_json():
    from localflash.registry.pairs import get_pair

    rows = json.loads((Path(__file__).parents[2] / "benchmarks/drafter/kv_acceptance.json").read_text())["rows"]
    measured = {r["pair"].split(":")[0]: r["acceptance"] for r in rows if r["kv"] == r["kv_drafter"] == "f16"}
    for name in ("demo", "demo-draft"):
        assert get_pair(name).acceptance == pytest.approx(measured[name], abs=5e-4), name


def test_the_run_guard_judges_a_run_by_its_pairs_models_toml_acceptance_and_says_so():
    import localflash

    with localflash.load(pair="demo", threads=1) as llm:  # models.toml: demo expects 2.0% (DFlash, f16 caches)
        line = llm.acceptance_note(stats(1000, 2))
        assert "0.2% (2/1000) is far below this pair's expected acceptance 2.0% (models.toml acceptance of pair demo)" in line
        assert "with f16 caches: the drafter likely does not fit" in line
        assert llm.acceptance_note(stats(1000, 15)) == ""  # 1.5%: not under half of 2.0%
        assert llm.acceptance_note(stats(200, 0)) == ""  # a 2% reference would have accepted 4: too few to judge
        assert llm.acceptance_note(stats(1000, 0, name="ngram")) == ""  # not the pair's drafter kind: not its figure


def test_the_guard_says_which_reference_fired():
    st = stats(600, 9)
    assert "its own acceptance with f16 caches 55%" in acceptance_guard(st, f16_acceptance=0.55, expected=0.6, pair="p")
    line = acceptance_guard(st, f16_acceptance=0.02, expected=0.6, pair="p")  # 1.5% is not far below 2%: the pair's fires
    assert "this pair's expected acceptance 60% (models.toml acceptance of pair p)" in line
