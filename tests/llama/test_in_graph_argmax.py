"""Drafts read through llama.cpp's in-graph argmax (backend sampling) are the drafts NumPy reads from the logits.

The shipped DFlash drafter on its SmolLM2 target gets some drafts right, so the comparison
is of the draft ids themselves, cycle by cycle, not only of counts that verification forces
equal (a wrong id is rejected and the output stays plain decoding's either way).
"""

from __future__ import annotations

from localflash.llama import Context, ContextOptions, Model
from localflash.registry.pairs import get_pair
from localflash.speculative.dflash import DFlashDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.stats import Stats
from localflash.train.data import chat_tokens


class Logged(DFlashDrafter):
    """Keeps every proposal."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.proposals: list[list[int]] = []

    def propose(self, history, n_past, k):
        drafts = super().propose(history, n_past, k)
        self.proposals.append(drafts)
        return drafts


def test_dflash_in_graph_argmax_drafts_what_numpy_drafts(smollm2):
    target = Model(smollm2)
    drafter_file = get_pair("demo").drafter
    toks = chat_tokens(target, "Write a Python function that returns the n-th Fibonacci number.")
    runs = {}
    for in_graph in (False, True):
        ctx = Context(target, ContextOptions(n_ctx=1024, n_outputs_max=16, n_threads=1))
        drafter = Logged(Model(drafter_file), target, ctx, 1024 + 16, n_threads=1, in_graph_argmax=in_graph)
        assert drafter.in_graph == in_graph
        eng = Engine(target, ctx, drafter, adaptive=False)
        st = Stats()
        out = [t for c in eng.generate(toks, 64, None, st) for t in c]
        runs[in_graph] = (out, drafter.proposals, st)
        eng.close()
    (out_host, drafts_host, st_host), (out_graph, drafts_graph, st_graph) = runs[False], runs[True]
    assert len(drafts_host) > 10 and sum(len(d) == 15 for d in drafts_host) > 10
    assert drafts_graph == drafts_host  # the ids, cycle by cycle
    assert out_graph == out_host and st_graph.accepted == st_host.accepted > 0  # a trained drafter: some ids are right
