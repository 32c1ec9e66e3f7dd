"""The output buffer read from its start (llama/outputs.py) gives what llama.cpp's per-row and per-layer getters give.

The loop reads a decode's in-graph ids and tapped layer inputs from one ``llama_get_logits`` call; these tests
assert that this path is the one taken (not the getters' fallback) and that it returns the getters' ids and
addresses, for every output count, with layer taps, on a drafter context with nextn rows and on several sequences.
"""

from __future__ import annotations

import numpy as np

from localflash.llama import Context, ContextOptions, Model
from localflash.llama.bindings import ext_address, lib
from localflash.llama.sequences import SeqView, decode_views


def _ids(ctx, rows):
    get = lib().llama_get_sampled_token_ith
    return [get(ctx.ptr, i) for i in rows]


def test_sampled_ids_and_layer_inputs_come_from_the_buffer_start(tiny_target):
    target = Model(tiny_target)
    ctx = Context(target, ContextOptions(n_ctx=256, n_batch=64, n_ubatch=64, n_outputs_max=16, n_threads=1))
    ctx.capture_layer_inputs([3, 1])
    for settings in ((0.0, 0, 1.0, 0.0, None), (0.8, 40, 0.95, 0.05, 7)):
        assert ctx.sample_in_graph(*settings)
        pos = 0
        for n, outputs in ((5, "all"), (1, "last"), (9, "last"), (16, "all"), (3, "all")):
            tokens = [(pos * 7 + i * 13) % 500 + 10 for i in range(n)]
            ctx.decode(tokens, pos, outputs)
            view = ctx._sampled_view()
            assert view is not None  # the fast path, not the getters
            if outputs == "all":
                assert view[:] == _ids(ctx, range(n))
                assert ctx.sampled_rows(1, n) == _ids(ctx, range(1, n))
            assert view[-1] == _ids(ctx, [-1])[0]
            addresses = ctx._layer_addresses([1, 3])
            assert addresses is not None
            get = ext_address("llama_get_embeddings_layer_inp")
            assert list(addresses) == [get(ctx.ptr, 1), get(ctx.ptr, 3)]
            assert [v.ctypes.data for v in ctx.layer_inputs([1, 3], n)] == list(addresses)
            assert ctx.layer_inputs([1, 3], n)[1].shape == (n, target.n_embd)
            rows = ctx.layer_input_rows([1, 3], n)  # both taps side by side, one view: what a DFlash batch row takes
            assert rows.shape == (n, 2, target.n_embd)
            assert (rows.reshape(n, -1) == np.concatenate(ctx.layer_inputs([1, 3], n), axis=1)).all()
            assert type(ctx.layer_input_rows([3, 1], n)) is list  # not laid out in that order: the views one by one
            draft = _ids(ctx, range(n))[:-1] if outputs == "all" else []
            assert ctx.verify_sampled(draft, frozenset()) == ctx._verify_rows(draft, frozenset())
            pos += n
        ctx.sample_on_host()
        ctx.clear()
    assert ctx._sampled_view() is None  # no chain attached: no ids to read
    ctx.decode([11, 12, 13], 0, "all")
    assert ctx.sample_in_graph()
    assert ctx._sampled_view() is None  # attached after that decode: its buffer holds no ids
    ctx.close()


def test_a_drafter_context_with_nextn_rows_and_several_sequences(tiny_target, tiny_dflash):
    from localflash.speculative.dflash import dflash_context

    target = Model(tiny_target)
    tctx = Context(target, ContextOptions(n_ctx=256, n_outputs_max=16, n_threads=1))
    dctx = dflash_context(Model(tiny_dflash), tctx, 128, n_threads=1, n_seq=3)
    dctx.output_nextn(masked=False)  # a DFlash2/DSpark drafter's unmasked nextn rows shift the ids' place
    assert dctx.sample_greedy_in_graph(3)
    views = [SeqView(dctx, i) for i in range(3)]
    mask = dctx.model.mask_token()
    decode_views(dctx, [(v, [20 + v.seq] + [mask] * 15, 0, "all") for v in views])
    assert dctx._sampled_view() is not None
    for v in views:
        assert v.sampled_rows(1, 16) == _ids(dctx, range(16 * v.seq + 1, 16 * v.seq + 16))
    tctx.close()
    dctx.close()


def test_a_drafter_batch_gets_the_same_feature_rows_from_the_joined_view_as_from_the_layers(tiny_target, tiny_dflash):
    """DFlash intake copies a cycle's committed rows into the drafter's batch in one copy from the joined
    ``[rows, taps, width]`` view; the rows it decodes are the layers' rows side by side, as the per-layer path writes them."""
    from localflash.speculative.dflash import dflash_context

    target = Model(tiny_target)
    tctx = Context(target, ContextOptions(n_ctx=256, n_outputs_max=16, n_threads=1))
    dctx = dflash_context(Model(tiny_dflash), tctx, 128, n_threads=1)
    tctx.capture_layer_inputs([1, 2, 3])
    tctx.decode([11, 12, 13, 14, 15], 0, "all")
    joined = tctx.layer_input_rows([1, 2, 3], 5)
    assert type(joined) is np.ndarray and joined.shape == (5, 3, target.n_embd)
    dctx.decode_embd(joined, 0, 4)
    via_view = dctx._embd_batch.embd[:4].copy()
    dctx.seq_rm(0)
    dctx.decode_embd(tctx.layer_inputs([1, 2, 3], 5), 0, 4)
    assert (dctx._embd_batch.embd[:4] == via_view).all()
    assert (via_view == np.concatenate(tctx.layer_inputs([1, 2, 3], 4), axis=1)).all()
    tctx.close()
    dctx.close()
