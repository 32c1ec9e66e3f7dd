"""Drafts read through llama.cpp's in-graph argmax (backend sampling) are the drafts NumPy reads."""

from __future__ import annotations

from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.dflash import DFlashDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.stats import Stats


def test_dflash_in_graph_argmax_drafts_what_numpy_drafts(tiny_target, tiny_dflash):
    target = Model(tiny_target)
    toks = target.tokenize("the river of quiet stone and nine silver hills where we")
    runs = {}
    for in_graph in (False, True):
        ctx = Context(target, ContextOptions(n_ctx=512, n_outputs_max=16, n_threads=1))
        drafter = DFlashDrafter(Model(tiny_dflash), target, ctx, 512 + 16, n_threads=1, in_graph_argmax=in_graph)
        assert drafter.in_graph == in_graph
        eng = Engine(target, ctx, drafter, adaptive=False)
        st = Stats()
        out = [t for c in eng.generate(toks, 64, None, st) for t in c]
        runs[in_graph] = (out, st.drafted, st.accepted, list(st.pos_hits))
        eng.close()
    plain_ctx = Context(target, ContextOptions(n_ctx=512, n_threads=1))
    plain = [t for c in Engine(target, plain_ctx).generate(toks, 64) for t in c]
    assert runs[True] == runs[False] and runs[True][0] == plain
