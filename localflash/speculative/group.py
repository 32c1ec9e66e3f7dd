"""Every slot's drafter, driven for a whole batched step at once.

A :class:`~localflash.speculative.slots.SlotPool` step has two drafter phases: every drafting
slot proposes a draft (before the target decode), and every slot takes in what the target
committed (after it). The pool makes one call per phase on a :class:`DrafterGroup`. This
default loops over the slots' own drafters (n-gram: none; EAGLE-3: a context each); a kind whose
slot drafters share one multi-sequence context batches each phase across the slots (DFlash and
DFlash2: :class:`~localflash.speculative.dflash.DFlashGroup`, one decode a phase; a draft model:
:class:`~localflash.speculative.draft_model.DraftModelGroup`, and MTP:
:class:`~localflash.speculative.mtp.MtpGroup`, one decode a draft position).
:class:`LookupFirstGroup` puts prompt lookup in front of any of them (``--spec dflash+ngram``).

Drafts only decide speed: the target verifies every one, and a sampled row consumes one draw
of its request's generator whatever was drafted (``speculative/sampling.py``), so how a group
batches its drafts never changes what a slot emits.
"""

from __future__ import annotations

# one drafting slot's ask: (slot index, its history, n_past, k); one slot's target rows: (slot index, view, start, n)
Ask = tuple[int, list, int, int]
Taken = tuple[int, object, int, int]


class DrafterGroup:
    """The slots' drafters (``drafters[i]`` is slot i's); each phase loops over them."""

    # whether one drafter decode carries every drafting slot (a shared drafter context): a step's draft then costs
    # what the group's decodes cost, whichever slots draft, not the sum of each slot's share (step_policy.py)
    shared_draft = False

    def __init__(self, drafters: list):
        self.drafters = list(drafters)

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        """Each ask's draft (up to its k tokens), in the order asked."""
        return [self.drafters[i].propose(history, n_past, k) for i, history, n_past, k in asks]

    def on_target_decode(self, taken: list[Taken]) -> None:
        """Slot i's rows ``[0, n)`` of the last target decode (read through its view) are committed at ``start..``."""
        for i, view, start, n in taken:
            self.drafters[i].on_target_decode(view, start, n)

    def close(self) -> None:
        for d in reversed(self.drafters):  # slot 0's drafter owns a shared drafter model: closed last
            d.close()


class LookupFirstGroup(DrafterGroup):
    """Slots whose :class:`~localflash.speculative.drafter.LookupFirstDrafter` finds a prompt-lookup draft take it;
    the rest ask the model drafters' group (``inner``, over the wrapped drafters) together."""

    def __init__(self, drafters: list, inner: DrafterGroup):
        super().__init__(drafters)
        self.inner = inner
        self.shared_draft = inner.shared_draft

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        out: list[list[int]] = []
        rest = []
        for j, (i, history, n_past, k) in enumerate(asks):
            out.append(self.drafters[i].lookup.propose(history, n_past, k))
            if out[-1]:
                self.drafters[i].looked_up += 1
            else:
                self.drafters[i].modelled += 1
                rest.append(j)
        for j, draft in zip(rest, self.inner.propose([asks[j] for j in rest]) if rest else []):
            out[j] = draft
        return out

    def on_target_decode(self, taken: list[Taken]) -> None:
        self.inner.on_target_decode(taken)

    def close(self) -> None:
        self.inner.close()
