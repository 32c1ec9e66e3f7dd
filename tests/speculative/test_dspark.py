"""DSpark drafters (DFlash + Markov head + confidence head): detected from the file, anchor-first, cut by
confidence, lossless in one stream, in slots and in trees on a dense and a hybrid K-quant target."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from localflash.engine import make_drafter
from localflash.errors import LocalflashError
from localflash.formats.dflash_gguf import DSparkSpec
from localflash.formats.gguf_meta import read_meta
from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.dspark import confidence_cut, confidence_scores
from localflash.speculative.loop import Engine
from localflash.speculative.stats import Stats
from localflash.testing.tiny import write_dspark

N_CTX = 1024


@pytest.fixture(scope="module")
def dspark_files(tiny_dir, tiny_target):
    return {
        "random": write_dspark(tiny_dir / "dspark.gguf", DSparkSpec(target_layers=[1, 2, 3])),
        "agree": write_dspark(tiny_dir / "dspark-agree.gguf", DSparkSpec(target_layers=[1, 2, 3], seed=6), agree_with=tiny_target),
        "bonus": write_dspark(tiny_dir / "dspark-bonus.gguf", DSparkSpec(target_layers=[0, 3], block_size=6, sample_from_anchor=False)),
        "no-conf": write_dspark(tiny_dir / "dspark-noconf.gguf", DSparkSpec(target_layers=[1, 2, 3], confidence=False)),
        "dsv4": write_dspark(tiny_dir / "dspark-dsv4.gguf", DSparkSpec(target_layers=[1, 2, 3], dsv4_hc=4)),
    }


def run(target, path, prompt, n=48, p_min=0.0):
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_outputs_max=17, n_threads=1))
    drafter = make_drafter("dflash", target, ctx, Model(path) if path else None, n_ctx=N_CTX, threads=1, p_min=p_min) if path else None
    engine = Engine(target, ctx, drafter, adaptive=False)
    stats = Stats()
    drafts: list[list[int]] = []
    if drafter is not None:
        propose = drafter.propose
        drafter.propose = lambda h, npast, k: drafts.append(propose(h, npast, k)) or drafts[-1]
    out = [t for chunk in engine.generate(target.tokenize(prompt), n, None, stats) for t in chunk]
    name = drafter.name if drafter else "none"
    engine.close()
    return out, stats, drafts, name


def test_a_dspark_file_is_told_from_dflash_by_its_markov_head(dspark_files, tiny_dflash):
    meta = read_meta(dspark_files["random"])
    assert meta.is_dflash and meta.is_dspark and meta.dspark_confidence and meta.sample_from_anchor
    assert not read_meta(tiny_dflash).is_dspark
    assert not read_meta(dspark_files["no-conf"]).dspark_confidence
    assert not read_meta(dspark_files["bonus"]).sample_from_anchor


def test_anchor_first_blocks_draft_every_position_and_the_bonus_layout_one_less(tiny_target, dspark_files):
    target = Model(tiny_target)
    plain, *_ = run(target, None, "the river a garden of quiet stone")
    out, st, drafts, name = run(target, dspark_files["random"], "the river a garden of quiet stone")
    assert name == "dspark" and out == plain
    assert max(len(d) for d in drafts) == 8  # block 8, anchor-first: 8 drafts (DFlash: 7)
    out, st, drafts, _ = run(target, dspark_files["bonus"], "the river a garden of quiet stone")
    assert out == plain and max(len(d) for d in drafts) == 5  # block 6, slot 0 a bonus anchor: 5


def test_the_markov_head_set_to_the_targets_bigram_earns_acceptance(tiny_target, dspark_files):
    target = Model(tiny_target)
    prompt = "paper over nine silver hills"
    plain, *_ = run(target, None, prompt)
    rand = run(target, dspark_files["random"], prompt)[1]
    out, agree, *_ = run(target, dspark_files["agree"], prompt)
    assert out == plain
    assert rand.acceptance < 0.05 and agree.tau > 1.5  # measured: random τ 1.05, agree τ 1.9


def test_the_confidence_cut_stops_each_draft_at_the_first_unsure_position(tiny_target, dspark_files):
    target = Model(tiny_target)
    prompt = "quiet stone light and paper"
    plain = run(target, None, prompt)[0]
    full = run(target, dspark_files["agree"], prompt)[1]
    out, cut, cut_drafts, _ = run(target, dspark_files["agree"], prompt, p_min=0.5)
    assert out == plain
    assert cut.drafted / cut.cycles < full.drafted / full.cycles
    assert any(0 < len(d) < 8 for d in cut_drafts)
    assert confidence_cut(np.array([0.9, 0.6, 0.4, 0.8]), 0.5) == 2 and confidence_cut(np.array([0.7, 0.9]), 0.5) == 2


def test_p_min_without_a_confidence_head_is_refused_in_one_line(tiny_target, dspark_files):
    target = Model(tiny_target)
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_threads=1))
    with pytest.raises(LocalflashError, match="without a confidence head"):
        make_drafter("dflash", target, ctx, Model(dspark_files["no-conf"]), n_ctx=N_CTX, threads=1, p_min=0.5)
    assert make_drafter("dflash", target, ctx, Model(dspark_files["no-conf"]), n_ctx=N_CTX, threads=1).name == "dspark"


def test_cli_refuses_a_dsv4_backbone_and_p_min_without_confidence_in_one_line(lf, tiny_target, dspark_files):
    r = lf("run", "-m", str(tiny_target), "--drafter", str(dspark_files["dsv4"]), "--spec", "dflash", "-n", "4", "hello")
    assert r.returncode != 0 and "DeepSeek-V4 backbone" in r.stderr and len(r.stderr.strip().splitlines()) <= 2
    r = lf("plan", "--target", str(tiny_target), "--drafter", str(dspark_files["dsv4"]))
    assert r.returncode != 0 and "DeepSeek-V4 backbone" in r.stderr
    r = lf("run", "-m", str(tiny_target), "--drafter", str(dspark_files["no-conf"]), "--p-min", "0.5", "-n", "4", "hello")
    assert r.returncode != 0 and "without a confidence head" in r.stderr and len(r.stderr.strip().splitlines()) <= 2


def test_confidence_sets_tree_width_siblings_score_where_the_chain_is_unsure():
    logp = np.log(np.array([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]]))
    s = confidence_scores(logp, np.array([0.95, 0.2]))
    assert s[0, 0] == pytest.approx(np.log(0.95)) and s[1, 0] == pytest.approx(np.log(0.2))
    assert s[0, 1] < s[1, 1]  # a sibling is worth more where the chain is unsure
    assert np.exp(s[1, 1]) == pytest.approx(0.8 * 0.3 / 0.4)


def test_plan_prices_the_markov_head(tiny_target, dspark_files, tiny_dflash):
    from localflash.plan import Wishes, make_plan
    from localflash.plan.devices import HostMemory

    t = read_meta(tiny_target)
    host = HostMemory(total=64 << 30, available=64 << 30)
    ds = make_plan(t, read_meta(dspark_files["random"]), [], host, Wishes(ctx=1024))
    df = make_plan(t, read_meta(tiny_dflash), [], host, Wishes(ctx=1024))
    markov = sum(x.n_bytes for x in read_meta(dspark_files["random"]).tensors if x.name.startswith(("markov", "conf_proj")))
    assert ds.host.drafter_weights >= markov > 0
    assert ds.host.drafter_compute > 0 and ds.host.used > df.host.used - df.host.drafter_weights


# -- lossless, exact mode (process-wide: a subprocess) -------------------------------------------------------------

LOSSLESS = r"""
import json, sys, threading
from localflash.api import load
from localflash.testing.prompts import word_prompts
spec = json.loads(sys.argv[1])
prompts, n = word_prompts(spec["prompts"], seed=3), spec["tokens"]
base = dict(model=spec["target"], threads=1, ctx=1024, exact=True)
seeded = lambda i: dict(temperature=0.9, top_k=20, seed=50 + i)

def run_all(llm, sampled):
    out = [None] * len(prompts)
    def go(slot):  # each slot takes every n_slots-th prompt: all slots busy at once
        for i in range(slot, len(prompts), llm.n_slots):
            out[i] = llm.start(prompts[i], raw=True, max_tokens=n, slot=slot, **(seeded(i) if sampled else {})).completion()
    ts = [threading.Thread(target=go, args=(k,)) for k in range(llm.n_slots)]
    [t.start() for t in ts]; [t.join() for t in ts]
    return [c.token_ids for c in out], sum(c.stats.accepted for c in out), sum(c.stats.drafted for c in out), out[0].stats.drafter

res = {}
with load(**base, spec="none") as llm:
    res["plain"] = [run_all(llm, False)[0], run_all(llm, True)[0]]
for mode in spec["modes"]:
    kw = dict(drafter=spec["drafter"], spec="dflash", p_min=mode.get("p_min", 0.0), fixed=mode.get("fixed", True))
    if mode.get("tree"):
        kw["tree"] = mode["tree"]
    with load(**base, **kw, parallel=mode.get("slots", 1)) as llm:
        g, acc_g, dr_g, name = run_all(llm, False)
        s, acc_s, dr_s, _ = run_all(llm, True)
        res[mode["label"]] = [g, s, name, acc_g + acc_s, dr_g + dr_s]
print(json.dumps(res))
"""


def lossless(target, drafter, modes, prompts=6, tokens=40) -> dict:
    spec = dict(target=str(target), drafter=str(drafter), modes=modes, prompts=prompts, tokens=tokens)
    r = subprocess.run([sys.executable, "-c", LOSSLESS, json.dumps(spec)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense-q4k", "qwen35-q4k"])
def test_dspark_greedy_and_seeded_sampling_equal_plain_in_one_stream_slots_and_trees(hybrid, tiny_q4k, tiny_qwen35_q4k, tiny_dir):
    """K-quant targets in exact mode (a row's logits do not depend on its batch); trees on the dense target only
    (refused on hybrids: engine.TREE_ON_RECURRENT)."""
    target = tiny_qwen35_q4k if hybrid else tiny_q4k
    layers = [1, 3, 5] if hybrid else [0, 1]
    drafter = write_dspark(tiny_dir / f"dspark-256-{'h' if hybrid else 'd'}.gguf",
                           DSparkSpec(n_embd=256, n_head=4, n_head_kv=2, target_layers=layers, seed=9), agree_with=target)
    modes = [dict(label="stream"), dict(label="stream-pmin", p_min=0.5), dict(label="stream-adaptive", fixed=False), dict(label="slots", slots=2),
             dict(label="slots-pmin", slots=2, p_min=0.5)]
    if not hybrid:
        modes += [dict(label="tree", tree=8), dict(label="tree-pmin", tree=8, p_min=0.5)]
    res = lossless(target, drafter, modes)
    plain_greedy, plain_sampled = res["plain"]
    for mode in modes:
        greedy, sampled, name, accepted, drafted = res[mode["label"]]
        # the adaptive length may turn drafting off on a CPU, where a verify row costs about a plain step
        assert name == "dspark" and (mode.get("fixed") is False or accepted > 0), (mode, name, accepted, drafted)
        assert greedy == plain_greedy, f"{mode['label']}: greedy differs from plain"
        assert sampled == plain_sampled, f"{mode['label']}: seeded sampling differs from plain"
