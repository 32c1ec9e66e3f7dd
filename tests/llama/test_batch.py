"""Batch rows' sequence ids as llama.cpp reads them (through ``llama_batch.seq_id``'s row pointers)."""

from __future__ import annotations

import numpy as np

from localflash.llama.batch import Batch


def _rows(b: Batch, n: int) -> list[list[int]]:
    return [[b.raw.seq_id[i][j] for j in range(b.raw.n_seq_id[i])] for i in range(n)]


def test_batch_rows_take_the_sequences_each_setter_asks_for():
    b = Batch(8, n_seq_max=4)
    assert _rows(b, 8) == [[0]] * 8  # as made
    b.set_seqs([2, 0, 3, 3, 1])
    assert _rows(b, 5) == [[2], [0], [3], [3], [1]]
    b.set_seqs([[0, 1, 2], 0, [1, 2], 3])  # a tree's rows, through the per-row path
    assert _rows(b, 4) == [[0, 1, 2], [0], [1, 2], [3]]
    b.set_seq_spans(np.array([0, 0, 2, 3, 1], np.int32), np.array([4, 2, 1, 1, 1], np.int32))
    assert _rows(b, 6) == [[0, 1, 2, 3], [0, 1], [2], [3], [1], [0]]  # row 5: back to one id (it listed none)
    b.set_seq_range(2, 1, 3)
    assert _rows(b, 5) == [[0], [2], [2], [2], [1]]
    b.reset_seqs(5)
    assert _rows(b, 8) == [[0]] * 8
    b.close()


def test_a_tree_batch_of_more_sequences_than_the_batch_holds_is_refused():
    b = Batch(4, n_seq_max=2)
    try:
        b.set_seq_spans(np.array([0, 0], np.int32), np.array([3, 1], np.int32))
    except ValueError as e:
        assert "1..2" in str(e)
    else:
        raise AssertionError("three sequences in a row of a two-sequence batch went through")
    b.close()
