"""One draft length for a whole batched step of several slots.

In a step every active slot's rows go through one target decode, so a longer draft
for one slot costs every slot the time of its extra rows. The step therefore picks
one length k (each slot drafts ``min(k, its own limit)``) that maximises

    sum over slots of E_s(k)  /  (verify(rows(k)) + sum over slots of draft_s(k))

where ``E_s`` is the slot's expected committed tokens (its own acceptance, from its
:class:`~localflash.speculative.adapt.DraftPolicy`), ``rows(k)`` the rows the step
decodes, ``verify`` the measured seconds of a decode of that many rows (all slots
together) and ``draft_s`` the slot's measured drafting time. k = 0 is plain batched
decoding; drafting must promise MARGIN more tokens per second than it before it is
chosen, so the aggregate with drafting does not fall below plain batched decoding.
While off it probes now and then (doubling waits), as the one-stream policy does; a probe
drafts on one slot only (``probe_slot``, in turn), so what it costs the step is one slot's
draft and rows, not every slot's (a DFlash probe on 8 slots took in up to 8 x 64 held rows
and drafted 8 blocks, ~0.1–0.2 s on this CPU, for acceptance figures of each slot), and
probes are spaced so they cost at most PROBE_SHARE of the time off (:meth:`probe_floor`:
on a CPU where a DFlash draft costs two target steps, every ~300 steps instead of every 16–256), by what
the last probe step was measured to cost over a plain one (:meth:`record_probe`) where that is more.

A shared drafter (``shared_draft``: DFlash, a draft model, MTP on one context for all slots) drafts every
slot in the same decodes, and the step waits for them whole: a draft model's k decodes cost the step the
same whether one slot drafts or eight. Its draft cost is then the step's own, measured by the step's draft
length (:meth:`record_draft`: the group's draft and intake time), not the sum of each slot's share: a share
measured while four slots drafted together is a quarter of what the same decodes cost one slot drafting
alone, which made drafting look cheap on the steps where fewer slots were left (and lose to plain steps).
"""

from __future__ import annotations

import numpy as np

from localflash.speculative.adapt import (MARGIN, PRIOR_HITS, PRIOR_TRIES, PROBE_DRAFT, PROBE_EVERY, PROBE_MAX, CostTable,
                                          probe_floor)


class StepPolicy:
    """Chooses the step's draft length from per-slot acceptance and measured step costs."""

    def __init__(self, max_draft: int, adaptive: bool = True, max_rows: int = 1 << 30, shared_draft: bool = False,
                 draft_cost_grows: bool = True):
        self.max_draft = max_draft
        self.adaptive = adaptive
        self.max_rows = max_rows  # rows one decode may carry (n_batch, outputs, exact mode's limit)
        self.verify = CostTable()  # seconds of a decode, by its total rows
        self.shared_draft = shared_draft
        self.draft_cost_grows = draft_cost_grows
        self.draft = CostTable()  # shared drafters: seconds of a step's drafter decodes, by the step's draft length
        self.cycles_off = 0
        self.probe_wait = PROBE_EVERY
        self.probing = False
        self.probe_slot: int | None = None  # the step is a probe: only this slot (its index in choose's list) drafts
        self.probe_turn = 0
        self.probe_extra: float | None = None  # seconds the last probe step took over a plain step of its slots (record_probe)
        self.last_choice = 0

    @property
    def off(self) -> bool:
        """Whether the adaptive policy measured drafting and chose plain steps since its last drafting step."""
        return self.adaptive and self.cycles_off > 0

    @staticmethod
    def rows(limits: list[int], k: int) -> int:
        return len(limits) + sum([k if k < lim else lim for lim in limits])

    def choose(self, slots: list[tuple[object, int]]) -> int:
        """The step's draft length; ``slots``: (the slot's DraftPolicy, its own limit) per active slot.
        After a probe's choice ``probe_slot`` names the one slot that drafts."""
        self.probe_slot = None
        limits = [lim for _, lim in slots]
        top = max([0] + limits)
        top = min(top, self.max_draft)
        if top == 0:  # (plain decoding, or no room to draft: no arrays to build)
            self.last_choice = 0
            return 0
        drafts = np.minimum(np.arange(top + 1), np.array(limits)[:, None])  # [slot, k]: what each slot drafts at k
        rows = (len(limits) + drafts.sum(axis=0)).tolist()  # rows(limits, k) for every k
        while top and rows[top] > self.max_rows:
            top -= 1
        if top == 0:
            self.last_choice = 0
            return 0
        if not self.adaptive:
            self.last_choice = top
            return top
        best, best_score = 0, -1.0
        floor = 0.0
        expected = self.expected([p for p, _ in slots], drafts[:, : top + 1])
        for k in range(top + 1):
            v = self.verify(rows[k])
            if v is None:
                self.last_choice = top  # nothing measured yet: try the full length once
                return top
            cost = v
            if not self.shared_draft:  # each slot's own drafter: its measured draft cost
                for policy, lim in slots:
                    kk = k if k < lim else lim
                    if kk:
                        cost += policy.draft(kk if policy.draft_cost_grows else 1) or 0.0
            if k and self.shared_draft:  # one set of decodes for every drafting slot: the step's measured cost
                cost += self.draft(k if self.draft_cost_grows else 1) or 0.0
            floor = cost = max(cost, floor)  # a longer draft never costs less
            if cost <= 0:
                continue
            score = expected[k] / cost
            if k == 0:
                best_score = score * (1.0 + MARGIN)
            elif score > best_score:
                best, best_score = k, score
        if best == 0:
            if self.probing:
                self.probe_wait = min(PROBE_MAX, 2 * self.probe_wait)
            self.probing = False
            self.cycles_off += 1
            if self.cycles_off >= self.probe_wait:  # (the slot list is looked at only once the wait is over)
                able = [j for j, lim in enumerate(limits) if lim > 0]
                turn = able[self.probe_turn % len(able)]
                if self.cycles_off >= self.probe_floor(slots[turn][0], limits):
                    self.cycles_off, self.probing, best = 0, True, min(PROBE_DRAFT, top)
                    self.probe_slot = turn
                    self.probe_turn += 1
        else:
            self.cycles_off, self.probe_wait, self.probing = 0, PROBE_EVERY, False
        self.last_choice = best
        return best

    @staticmethod
    def expected(policies: list, drafts: np.ndarray) -> list[float]:
        """Expected tokens of the step at each k: the sum over slots of each slot's
        ``DraftPolicy.expected_tokens(drafts[slot, k])``, for all slots and lengths at once (the same sums in the
        same order: 1 + the running products of the acceptance rates, added up slot after slot)."""
        n = drafts.shape[1] - 1
        if not n:
            return [float(len(policies))]
        hits = np.array([p.hits[:n] for p in policies], np.float64)
        tries = np.array([p.tries[:n] for p in policies], np.float64)
        run = np.cumprod((hits + PRIOR_HITS) / (tries + PRIOR_TRIES), axis=1)
        each = np.cumsum(np.concatenate([np.ones((len(policies), 1)), run], axis=1), axis=1)  # [slot, j]: E_slot(j)
        total = 0.0
        for row, d in zip(each, drafts):  # slot after slot, as a loop of += would add them
            total = total + row[d]
        return total.tolist()

    def probe_floor(self, policy, limits: list[int]) -> float:
        """Plain steps to wait at least before a probe (:func:`~localflash.speculative.adapt.probe_floor`):
        its slot's draft and its rows over a plain step's."""
        rows, k = self.rows(limits, 0), PROBE_DRAFT
        draft = self.draft if self.shared_draft else policy.draft
        return probe_floor(self.verify(rows), self.verify(rows + k), draft(k if policy.draft_cost_grows else 1), self.probe_extra)

    def record_probe(self, rows: int, seconds: float) -> None:
        """A probe step of ``rows`` plain rows (one per slot) took ``seconds`` in all (its draft, its drafter's
        catch-up, its verify and intake): what it cost over a plain step of those rows spaces the next probe.
        A draft model that sat out the plain steps catches up on up to CATCH_UP_MAX tokens in a probe (a 64-row
        decode of the draft model), which neither the verify table nor a drafting step's draft cost shows."""
        plain = self.verify(rows)
        if plain is not None:
            self.probe_extra = max(seconds - plain, 0.0)

    def record(self, rows: int, seconds: float) -> None:
        self.verify.add(rows, seconds)

    def record_draft(self, k: int, seconds: float) -> None:
        """A step whose longest draft asked was ``k`` spent ``seconds`` in its drafter group (shared drafters' cost)."""
        if self.shared_draft and k:
            self.draft.add(k if self.draft_cost_grows else 1, seconds)
