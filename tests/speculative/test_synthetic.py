"""The benchmark-only synthetic drafter: the target accepts exactly its right tokens, output still plain decoding's."""

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


class CycleLog(Stats):
    """Stats that also keep each cycle's (drafted, accepted)."""

    def __init__(self):
        super().__init__()
        self.cycle_log: list[tuple[int, int]] = []

    def record_cycle(self, n_drafted: int, n_accepted: int, n_committed: int) -> None:
        super().record_cycle(n_drafted, n_accepted, n_committed)
        self.cycle_log.append((n_drafted, n_accepted))


class ProposalLog(SyntheticDrafter):
    """Keeps each proposal and what the reference says at its positions."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.proposals: list[tuple[list[int], list[int]]] = []

    def propose(self, history, n_past, k):
        draft = super().propose(history, n_past, k)
        if draft:
            self.proposals.append((draft, self.reference[len(history):len(history) + len(draft)]))
        return draft


def _leading_right(draft: list[int], truth: list[int]) -> int:
    n = 0
    while n < len(draft) and draft[n] == truth[n]:
        n += 1
    return n


def test_the_target_accepts_exactly_the_synthetic_drafters_right_tokens_and_output_equals_plain(tiny_target):
    """Each cycle accepts the drafts up to the first one that is not the target's own next token (no fewer: a
    verify that rejects a right draft still writes plain decoding's text), and the tokens the drafter counts
    as right are the target's own."""
    target = Model(tiny_target)
    alpha, k = 0.7, 6
    cycles = matches = right = 0
    for sp in (None, SamplingParams(temperature=0.9, top_k=0, top_p=0.95, seed=11)):
        for text in PROMPTS:
            toks = target.tokenize(text)
            plain, _ = _run(target, toks, 160, sampling=sp)
            d = ProposalLog(alpha, k, target.n_vocab, seed=3)
            d.set_reference(toks + plain)
            ctx = Context(target, ContextOptions(n_ctx=512, n_outputs_max=k + 1, n_threads=1))
            st = CycleLog()
            spec = [t for c in Engine(target, ctx, d, adaptive=False, draft_max=k).generate(toks, 160, sp, st) for t in c]
            ctx.close()
            assert spec == plain
            assert d.off_track == 0
            drafted = [(n, m) for n, m in st.cycle_log if n]
            assert len(drafted) == len(d.proposals)
            for (n, m), (draft, truth) in zip(drafted, d.proposals):
                assert n == len(draft) and m == _leading_right(draft, truth)
            cycles += len(drafted)
            matches += sum(a == b for draft, truth in d.proposals for a, b in zip(draft, truth))
            right += d.right
    assert cycles > 150 and matches == right > 0


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
