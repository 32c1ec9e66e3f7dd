"""A sampler chain per sequence (llama/graph_sampling.py, through SeqView): each sequence's rows drawn by its own
chain in one decode, its own stream advanced by what it commits, and logits brought to the host only for rows whose
sequence has no chain (what a slot pool sampling in the graph relies on: speculative/graph_sampler.slot_sampler)."""

from __future__ import annotations

import ctypes

import numpy as np

from localflash.llama import Context, ContextOptions, Model
from localflash.llama.bindings import lib, lib_address
from localflash.llama.sequences import SeqView, decode_views


def test_each_sequence_samples_with_its_own_chain_and_only_host_sampled_rows_bring_logits(tiny_target):
    """Three sequences in one decode, each with a chain of its own: every view's ids are the getters' (one read
    of the buffer), the greedy sequence's ids are its rows' argmax, the seeded one draws its own stream (a view
    accepts what it commits; the others' streams stay put); no logits reach the host while every output row's
    sequence has a chain, and they do once one sequence is detached (its rows sampled on the host)."""
    target = Model(tiny_target)
    ctx = Context(target, ContextOptions(n_ctx=768, n_batch=64, n_ubatch=64, n_outputs_max=24, n_threads=1, n_seq_max=3,
                                         kv_unified=False))
    views = [SeqView(ctx, i) for i in range(3)]
    tokens = [[(17 * s + 5 * i) % 400 + 10 for i in range(6)] for s in range(3)]
    get_logits = lib_address("llama_get_logits")

    def step(outputs=True):
        decode_views(ctx, [(v, tokens[v.seq], 0, outputs) for v in views])

    def host_rows():
        n = 18 * target.n_vocab  # (a view of its own: the loop's cached views are not written to)
        return np.frombuffer((ctypes.c_float * n).from_address(get_logits(ctx.ptr)), np.float32).reshape(18, -1)

    step()  # on the host: the reference rows
    argmax = [host_rows()[6 * s : 6 * s + 6].argmax(axis=1).tolist() for s in range(3)]
    for v in views:
        v.clear()
    assert views[0].sample_in_graph() and views[1].sample_in_graph(1.0, 0, 1.0, 0.0, seed=3)
    assert views[2].sample_in_graph(0.8, 40, 0.95, 0.0, seed=4)
    for v in views:
        v.clear()
    step()
    get = lib().llama_get_sampled_token_ith
    ids = [[get(ctx.ptr, 6 * s + i) for i in range(6)] for s in range(3)]
    assert ids[0] == argmax[0]
    assert ids[1] != argmax[1]  # unfiltered at temperature 1 on near-flat random rows: not the argmax
    host_rows()[:] = np.nan  # (the buffer as laid out with the chains)
    for v in views:
        v.clear()
    step()
    assert np.isnan(host_rows()).all()  # every output row sampled in the graph: no logits copied
    assert [[get(ctx.ptr, 6 * s + i) for i in range(6)] for s in range(3)] == ids  # nothing committed: the same draws
    assert ctx._sampled_view() is not None  # the views read their ids from the buffer, not the getters
    for v in views:  # no draft: the view's last row, committed to its own stream
        assert v.verify_sampled([], frozenset()) == [ids[v.seq][-1]]
    drafts = [ids[s][:5] for s in range(3)]
    for v in views:
        v.clear()
    step()  # the same rows again: seq 0 (greedy) the same ids; the seeded ones one draw further on their streams
    again = [[get(ctx.ptr, 6 * s + i) for i in range(6)] for s in range(3)]
    assert again[0] == ids[0] and again[1] != ids[1]  # the seeded streams had moved on by the one committed draw
    assert [v.verify_sampled(drafts[v.seq], frozenset()) for v in views][0] == ids[0]
    assert views[1].sample_in_graph(1.0, 0, 1.0, 0.0, seed=3)  # the same settings: the chain reset to its seed
    for v in views:
        v.clear()
    step()
    assert [get(ctx.ptr, 6 + i) for i in range(6)] == ids[1]  # the stream from its start: the first decode's draws
    views[2].sample_on_host()  # one sequence's rows on the host: llama.cpp copies this micro-batch's rows
    host_rows()[:] = np.nan
    for v in views:
        v.clear()
    step()
    assert not np.isnan(host_rows()[12:]).any() and views[2].all_logits().argmax(axis=1).tolist() == argmax[2]
    assert [get(ctx.ptr, i) for i in range(6)] == argmax[0]  # the others still sampled by their chains
    assert views[0].samples_in_graph and not views[2].samples_in_graph
    ctx.close()
