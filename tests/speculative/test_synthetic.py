"""The benchmark-only synthetic drafter: acceptance near the chosen α, output still plain decoding's."""

from __future__ import annotations

import json

import numpy as np

from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.speculative.synthetic import SyntheticDrafter

PROMPTS = ["the river of quiet stone and", "nine silver hills where we", "a garden of paper light over"]


def _run(target, toks, n, drafter=None, k=0, sampling=None):
    ctx = Context(target, ContextOptions(n_ctx=512, n_outputs_max=k + 1, n_threads=1))
    eng = Engine(target, ctx, drafter, adaptive=False, draft_max=k)
    st = Stats()
    out = [t for c in eng.generate(toks, n, sampling, st) for t in c]
    ctx.close()
    return out, st


def test_synthetic_acceptance_lands_near_alpha_and_output_equals_plain(tiny_target):
    target = Model(tiny_target)
    alpha, k = 0.7, 6
    right = wrong = first_tries = first_hits = 0
    for sp in (None, SamplingParams(temperature=0.9, top_k=0, top_p=0.95, seed=11)):
        for text in PROMPTS:
            toks = target.tokenize(text)
            plain, _ = _run(target, toks, 160, sampling=sp)
            d = SyntheticDrafter(alpha, k, target.n_vocab, seed=3)
            d.set_reference(toks + plain)
            spec, st = _run(target, toks, 160, d, k, sp)
            assert spec == plain
            assert d.off_track == 0
            right, wrong = right + d.right, wrong + d.wrong
            first_tries, first_hits = first_tries + st.pos_tries[0], first_hits + st.pos_hits[0]
    n = right + wrong
    assert n > 1000
    sd = (alpha * (1 - alpha) / n) ** 0.5
    assert abs(right / n - alpha) < 4 * sd, (right, n)
    # the target accepts exactly the right tokens: the first draft position is accepted at rate α
    assert abs(first_hits / first_tries - alpha) < 4 * (alpha * (1 - alpha) / first_tries) ** 0.5


def test_synthetic_drafter_stops_proposing_off_its_reference(tiny_target):
    target = Model(tiny_target)
    toks = target.tokenize(PROMPTS[0])
    plain, _ = _run(target, toks, 40)
    d = SyntheticDrafter(1.0, 4, target.n_vocab)
    d.set_reference(toks + [(t + 1) % target.n_vocab for t in plain])  # a reference the target never writes
    spec, st = _run(target, toks, 40, d, 4)
    assert spec == plain and st.accepted == 0 and d.off_track > 0


def test_bench_runs_synthetic_modes_outside_the_verdict(lf, tiny_target, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": str(i), "prompt": p}) for i, p in enumerate(PROMPTS[:2])) + "\n")
    r = lf("bench", "-m", tiny_target, "--prompts", prompts, "-t", "1", "-n", "48", "--modes", "synthetic",
           "--synthetic-accept", "0.5,0.95", "--draft-max", "4", "--fixed", "--raw", "--json", "-", "--no-save")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["modes"] == ["none", "synthetic@0.5", "synthetic@0.95"]
    res = report["results"]
    for m in report["modes"][1:]:
        assert res[m]["all"]["same_as_plain"] == 2
    assert res["synthetic@0.95"]["all"]["tau"] > res["synthetic@0.5"]["all"]["tau"] > 1.0
    assert np.isclose(res["synthetic@0.95"]["all"]["acceptance"], 0.95, atol=0.15)
    assert report["verdict"]["modes"] == {} and report["verdict"]["best"] == "none"


def test_bench_refuses_a_synthetic_rate_outside_zero_one(lf, tiny_target, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    r = lf("bench", "-m", tiny_target, "--prompts", prompts, "--modes", "synthetic", "--synthetic-accept", "0.5,1.5")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == ["error: --synthetic-accept '1.5' is not a rate"]
