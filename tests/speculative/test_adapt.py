"""The adaptive draft length: pure arithmetic on measured costs and acceptance, no model."""

from __future__ import annotations

import itertools

import pytest

from localflash.speculative.adapt import MARGIN, PROBE_EVERY, PROBE_FLOOR_MAX, PROBE_MAX, PROBE_SHARE, DraftPolicy


def _policy(verify_per_token: float, verify_base: float, rate: float, max_draft: int = 8) -> DraftPolicy:
    p = DraftPolicy(max_draft, adaptive=True, draft_cost_grows=False)
    for size in range(1, max_draft + 2):
        p.verify.add(size, verify_base + verify_per_token * size)
    p.draft.add(1, 0.0)
    for j in range(max_draft):
        p.hits[j], p.tries[j] = 1000.0 * rate, 1000.0
    return p


def _brute_force(p: DraftPolicy, top: int) -> int:
    costs = [max(p.cost(j) for j in range(k + 1)) for k in range(top + 1)]
    scores = [(p.expected_tokens(k) / costs[k], -k) for k in range(top + 1)]
    best = -max(scores)[1]
    return best if scores[best][0] > scores[0][0] * (1 + MARGIN) else 0


def test_choice_maximises_expected_tokens_per_second():
    for per_token, rate in itertools.product((0.0, 0.05, 0.3, 1.0), (0.0, 0.2, 0.5, 0.8, 0.95)):
        p = _policy(per_token, 1.0, rate)
        for top in (0, 1, 3, 8):
            assert p.choose(top) == _brute_force(p, top) or p.probing, (per_token, rate, top)


def test_free_verification_and_good_drafts_draft_the_most():
    assert _policy(0.0, 1.0, 0.9).choose(100) == 8


def test_probes_back_off_while_drafting_does_not_pay():
    p = _policy(0.001, 1.0, 0.0)  # rows nearly free (a GPU) and nothing is accepted: the doubling waits decide
    probes = [i for i in range(2000) if p.choose(100) > 0]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert probes[0] == PROBE_EVERY - 1
    assert gaps[:4] == [2 * PROBE_EVERY, 4 * PROBE_EVERY, 8 * PROBE_EVERY, 16 * PROBE_EVERY]
    assert max(gaps) == PROBE_MAX and len(probes) < 2000 / PROBE_MAX + 6


def test_probes_cost_at_most_their_share_of_the_time_off():
    """A probe's 2 extra rows and its draft cost several plain steps on a CPU: it waits until they are PROBE_SHARE
    of the plain steps' time (never longer than PROBE_FLOOR_MAX steps)."""
    for draft_cost, want in ((3.0, (2.0 + 3.0) / PROBE_SHARE), (0.5, (2.0 + 0.5) / PROBE_SHARE), (100.0, PROBE_FLOOR_MAX)):
        p = _policy(1.0, 0.0, 0.0)  # a verify of k+1 costs k+1 steps and nothing is accepted
        p.draft.ema.clear()
        p.draft.add(1, draft_cost)
        probes = [i for i in range(5000) if p.choose(100) > 0]
        gaps = [b - a for a, b in zip(probes, probes[1:])]
        assert probes and probes[0] >= want - 1 and min(gaps) >= want - 1e-9, (draft_cost, probes[:3])
        assert max(gaps) <= max(want, PROBE_MAX) + 1


def test_a_probe_that_cost_more_than_modelled_spaces_the_next_by_what_it_cost():
    """A draft model's probe also decodes the tokens it missed while off (up to 64 in one batch): the probe cycle's
    measured extra over a plain step, not the modelled draft + rows, sets the wait before the next probe."""
    p = _policy(1.0, 0.0, 0.0)  # modelled: a probe's 2 extra rows cost 2 plain steps, its draft nothing
    modelled = 2.0 / PROBE_SHARE
    steps = 0
    while p.choose(100) == 0:
        steps += 1
    assert steps >= modelled - 1
    p.record(2, 0, 3.0, 5.0)  # the probe: a 3-row verify (3 steps) and 5 steps of draft and catch-up; nothing accepted
    assert p.probe_extra == pytest.approx(5.0 + 2.0)
    steps = 0
    while p.choose(100) == 0:
        steps += 1
    assert steps >= min((5.0 + 2.0) / PROBE_SHARE, PROBE_FLOOR_MAX) - 1 > modelled
    p.record(0, 0, 1.0, 0.0)  # a plain step after the probe does not touch what the probe cost
    assert p.probe_extra == pytest.approx(7.0)


def test_a_probe_that_pays_resets_the_wait():
    p = _policy(0.001, 1.0, 0.0)
    while p.choose(100) == 0:
        pass
    for _ in range(3 * PROBE_EVERY):  # two more probes: the wait is now 4x
        p.choose(100)
    assert p.probe_wait > PROBE_EVERY
    for j in range(p.max_draft):  # the text turned repetitive: drafts are right again
        p.hits[j] = p.tries[j] = 1000.0
    p.verify.ema.clear()
    for size in range(1, 10):
        p.verify.add(size, 1.0 + 0.01 * size)
    assert p.choose(100) == 8 and p.probe_wait == PROBE_EVERY


def test_a_noisy_cost_table_is_read_as_non_decreasing():
    p = _policy(0.0, 1.0, 0.6, max_draft=4)
    p.verify.ema.update({1: 1.0, 2: 1.5, 3: 3.0, 4: 0.5, 5: 0.6})  # sizes 4 and 5 measured once, on a lucky cycle
    assert p.choose(100) == 1  # 1.6 tokens / 1.5 beats plain; 4 drafts at "0.6" would be a fluke


def test_a_marginal_gain_is_not_taken():
    p = _policy(0.0, 1.0, 0.0, max_draft=1)
    p.verify.ema.update({1: 1.0, 2: 1.0})
    p.hits[0], p.tries[0] = 0.03 * 1000, 1000.0  # drafting promises +3% (E = 1.03 at the same cost)
    assert p.choose(100) == 0
    p.hits[0] = 0.2 * 1000  # +20%
    assert p.choose(100) == 1


def test_drafting_off_is_explained_with_the_measured_costs():
    p = _policy(1.0, 0.0, 0.2, max_draft=15)  # a verify of k+1 tokens costs k+1 steps, 20% accepted
    assert p.choose(100) == 0
    why = p.off_reason()
    assert why.startswith("drafting off: here a 1-token draft costs 0.0× one target token and its 2-token verify 2.0×")
    assert "for 1.20 tokens a pass (0.60× plain)" in why and why.endswith("as on a GPU")
    cheap = _policy(0.0, 1.0, 0.02)  # verify free, drafts nearly never accepted
    assert cheap.choose(100) == 0 and cheap.off_reason().endswith("the drafter's tokens are not accepted often enough here")
    assert _policy(0.0, 1.0, 0.9).off_reason() is None  # drafting pays: nothing to explain
    assert DraftPolicy(8).off_reason() is None  # nothing measured yet


class CostModel:
    """A clock that moves only by modelled costs: every ``Context.decode`` of n rows costs n ms, nothing else costs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_run_says_why_drafting_went_off(tiny_target, tiny_dflash, monkeypatch):
    """`run` with a random-weight DFlash drafter (nothing accepted) on measured costs injected, not read off the clock.

    With a verify of k+1 rows costing k+1 plain steps and a 16-row DFlash block costing 16, the policy
    turns drafting off and `run` prints why, with these numbers, on every run.
    """
    from typer.testing import CliRunner

    from localflash import cli
    from localflash.llama import Context
    from localflash.speculative.loop import Engine

    clock = CostModel()
    real_decode = Context.decode

    def decode(self, tokens, start_pos, outputs="last"):
        out = real_decode(self, tokens, start_pos, outputs)
        clock.now += 1e-3 * len(tokens)
        return out

    monkeypatch.setattr(Context, "decode", decode)
    monkeypatch.setattr(Engine, "clock", staticmethod(clock))
    r = CliRunner().invoke(cli.app, ["run", "-m", str(tiny_target), "--drafter", str(tiny_dflash), "-n", "120", "-t", "1",
                                     "--raw", "one two three"])
    assert r.exit_code == 0, r.output
    why = [ln for ln in r.output.splitlines() if ln.startswith("drafting off:")]
    # a probe here costs 16 + 3 plain steps, so it is rare (probe_floor): 0 of 1 probe draft accepted in 120 tokens,
    # and with the prior a 3-token draft's 1.58 tokens a pass for 16 + 4 plain steps is still the best it could do
    assert why == ["drafting off: here a 3-token draft costs 16.0× one target token and its 4-token verify 4.0×, for 1.58 "
                   "tokens a pass (0.08× plain); drafting pays where both are nearly free next to one token, as on a GPU"], r.output
    assert "accepted 0/1" in r.output and "calibration 104 ms (once per engine)" in r.output


def test_calibration_is_reported_apart_from_decode_and_only_once(tiny_target, tiny_dflash, monkeypatch):
    """The first request pays the draft length's timing passes (Stats.t_calibrate); decode tok/s leaves them out."""
    from localflash.llama import Context, ContextOptions, Model
    from localflash.speculative.dflash import DFlashDrafter
    from localflash.speculative.loop import Engine
    from localflash.speculative.stats import Stats

    clock = CostModel()
    real_decode = Context.decode

    def decode(self, tokens, start_pos, outputs="last"):
        out = real_decode(self, tokens, start_pos, outputs)
        clock.now += 1e-3 * len(tokens)
        return out

    monkeypatch.setattr(Context, "decode", decode)
    target = Model(tiny_target)
    ctx = Context(target, ContextOptions(n_ctx=512, n_outputs_max=16, n_threads=1))
    eng = Engine(target, ctx, DFlashDrafter(Model(tiny_dflash), target, ctx, 512 + 16, n_threads=1), adaptive=True)
    eng.clock = clock
    first, second = Stats(), Stats()
    for st in (first, second):
        list(eng.generate(target.tokenize("one two three"), 24, None, st))
    eng.close()
    assert first.t_calibrate == pytest.approx(0.104, abs=1e-9)  # sizes 1, 2, 3, 4, 6, 8, 12, 16, each timed twice: 104 rows of 1 ms
    assert second.t_calibrate == 0.0 and "calibration" not in second.summary()
    assert "calibration 104 ms" in first.summary() and first.to_dict()["calibrate_ms"] == pytest.approx(104.0)
    # what the user waited for: prefill + calibration + decode, each counted once
    assert first.t_prefill + first.t_calibrate + first.t_decode == pytest.approx(clock.now - second.t_prefill - second.t_decode)


def test_cost_table_many_gives_each_size_what_one_call_gives():
    """The array form TreeSize reads a tree's sizes 1..n with: measured sizes, interpolated gaps, both ends."""
    import numpy as np

    from localflash.speculative.adapt import CostTable

    rng = np.random.default_rng(4)
    assert CostTable().many([1, 2]) is None
    for _ in range(50):
        table = CostTable()
        for size in rng.choice(np.arange(1, 40), size=int(rng.integers(1, 8)), replace=False).tolist():
            table.add(size, float(rng.uniform(1e-4, 5e-2)))
        sizes = list(range(0, 48))
        assert table.many(np.array(sizes)).tolist() == [table(s) for s in sizes]  # exactly: the same arithmetic
