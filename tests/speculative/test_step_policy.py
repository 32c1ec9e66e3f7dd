"""The slot pool's draft length for a whole step: pure arithmetic on measured step costs and each slot's acceptance."""

from __future__ import annotations

from localflash.speculative.adapt import PROBE_EVERY, DraftPolicy
from localflash.speculative.step_policy import StepPolicy


def _slot(rate: float, max_draft: int = 8) -> DraftPolicy:
    p = DraftPolicy(max_draft, adaptive=True, draft_cost_grows=False)
    p.draft.add(1, 0.0)
    for j in range(max_draft):
        p.hits[j], p.tries[j] = 1000.0 * rate, 1000.0
    return p


def _step(per_row: float, base: float, n_slots: int, max_draft: int = 8) -> StepPolicy:
    sp = StepPolicy(max_draft)
    for rows in range(1, n_slots * (max_draft + 1) + 1):
        sp.record(rows, base + per_row * rows)
    return sp


def test_a_probe_drafts_on_one_slot_in_turn_and_plain_steps_on_none():
    """Drafting does not pay (a row costs a step, nothing is accepted): plain steps, and every probe drafts on one
    slot only, each slot in turn, so a probe costs the batch one slot's draft, not every slot's."""
    slots = [(_slot(0.0), 8) for _ in range(4)]
    sp = _step(1.0, 0.0, 4)
    probed = []
    for _ in range(40 * PROBE_EVERY):
        k = sp.choose(slots)
        if k:
            assert sp.probing and sp.probe_slot is not None
            probed.append(sp.probe_slot)
        else:
            assert sp.probe_slot is None
    assert probed[:4] == [0, 1, 2, 3] and len(probed) >= 5


def test_a_probe_skips_slots_that_cannot_draft():
    slots = [(_slot(0.0), 0), (_slot(0.0), 8), (_slot(0.0), 0), (_slot(0.0), 8)]
    sp = _step(1.0, 0.0, 4)
    probed = [sp.probe_slot for _ in range(40 * PROBE_EVERY) if sp.choose(slots)]
    assert probed[:4] == [1, 3, 1, 3]


def test_when_drafting_pays_every_slot_drafts_the_chosen_length():
    slots = [(_slot(0.9), 8) for _ in range(4)]
    sp = _step(0.001, 1.0, 4)  # a row nearly free beside the pass
    assert sp.choose(slots) == 8 and sp.probe_slot is None and not sp.probing


def test_probes_are_spaced_so_they_cost_at_most_a_small_share_of_the_plain_steps():
    """A probe's draft costing 3 plain steps (a DFlash block on a CPU): probes come no more often than
    that cost / PROBE_SHARE steps; with a nearly free draft the doubling waits decide alone."""
    from localflash.speculative.adapt import PROBE_SHARE

    def probe_steps(draft_cost: float, per_row: float, base: float) -> list[int]:
        slot = _slot(0.0)
        slot.draft.ema.clear()
        slot.draft.add(1, draft_cost)
        sp = _step(per_row, base, 1)
        return [i for i in range(3000) if sp.choose([(slot, 8)])]

    dear = probe_steps(3.0, 1.0, 0.0)  # a plain step costs 1, a probe's 2 more rows 2 more, its draft 3
    gaps = [b - a for a, b in zip(dear, dear[1:])]
    assert dear and dear[0] >= (3.0 + 2.0) / PROBE_SHARE - 1 and min(gaps) >= (3.0 + 2.0) / PROBE_SHARE
    cheap = probe_steps(0.001, 0.001, 1.0)  # rows and drafts nearly free beside the pass (a GPU)
    assert cheap[0] == PROBE_EVERY - 1 and cheap[1] - cheap[0] == 2 * PROBE_EVERY


def test_a_shared_drafters_decodes_are_priced_whole_whichever_slots_draft():
    """One slot left of four: a shared drafter's decodes (3 steps' worth) cost that step all 3, not the quarter each
    slot was charged while four drafted together; at acceptance 0.75 drafting then loses and the step is plain."""
    def one_slot(shared: bool) -> int:
        slot = _slot(0.75)
        slot.draft.ema.clear()
        slot.draft.add(1, 3.0 / 4)  # its share of the group's decodes, measured while four slots drafted
        sp = StepPolicy(8, shared_draft=shared, draft_cost_grows=False)
        for rows in range(1, 40):
            sp.record(rows, 1.0 + 0.001 * rows)
        sp.record_draft(8, 3.0)
        return sp.choose([(slot, 8)])

    assert one_slot(shared=False) > 0  # by the slot's share, drafting looks 2x plain
    assert one_slot(shared=True) == 0


def test_a_steps_expected_tokens_are_the_sum_of_each_slots_bit_for_bit():
    """StepPolicy.expected (every slot and draft length at once) adds up DraftPolicy.expected_tokens exactly."""
    import numpy as np

    rng = np.random.default_rng(5)
    for _ in range(200):
        k, n = int(rng.integers(1, 16)), int(rng.integers(1, 9))
        pols = [DraftPolicy(k) for _ in range(n)]
        for p in pols:
            p.tries = list(rng.uniform(0, 40, k))
            p.hits = [t * r for t, r in zip(p.tries, rng.random(k))]
        limits = rng.integers(0, k + 1, n)
        got = StepPolicy.expected(pols, np.minimum(np.arange(k + 1), limits[:, None]))
        for j in range(k + 1):
            want = 0.0
            for p, lim in zip(pols, limits):
                want += p.expected_tokens(min(j, int(lim)))
            assert got[j] == want


def test_a_probe_measured_dearer_than_its_draft_table_spaces_the_next_probe_by_what_it_cost():
    """A draft model that sat out the plain steps catches up on up to 64 tokens in a probe: the probe step is
    measured whole (record_probe), and the next probe waits long enough for that cost to stay within PROBE_SHARE,
    even where the draft table (drafting steps without a catch-up) says a draft is cheap."""
    from localflash.speculative.adapt import PROBE_SHARE

    slot = _slot(0.0)
    sp = StepPolicy(8, shared_draft=True, draft_cost_grows=True)
    for rows in range(1, 12):
        sp.record(rows, 1.0 + 0.01 * rows)
    sp.record_draft(2, 0.02)  # a 2-token draft while drafting was on: cheap
    cheap = sp.probe_floor(slot, [8])
    sp.record_probe(1, 1.0 + 0.01 + 3.0)  # the probe step: a plain step's time plus 3 for its catch-up and draft
    assert cheap < 10 and abs(sp.probe_floor(slot, [8]) - 3.0 / (PROBE_SHARE * 1.01)) < 1.0
