"""How many prompt rows a slot pool's step takes while a prompt joins (speculative/prefill.py: prefill_rows)."""

from __future__ import annotations

from localflash.speculative.adapt import CostTable
from localflash.speculative.prefill import PREFILL_MIN_ROWS, prefill_rows


def _table(cost) -> CostTable:
    t = CostTable()
    for rows in (1, 2, 4, 8, 20):
        t.add(rows, cost(rows))
    return t


def test_no_decoding_slot_fills_whole_batches():
    assert prefill_rows(_table(lambda r: 0.01 + 0.001 * r), 0, False, 512, 2048) == 2048


def test_a_cpu_like_step_takes_about_its_own_cost_in_prompt_rows():
    # 10 ms fixed + 1 ms a row: a 20-row step costs 30 ms, i.e. 30 more rows at the slope
    assert prefill_rows(_table(lambda r: 0.010 + 0.001 * r), 20, True, 512, 2048) == 30


def test_a_gpu_like_step_fills_the_rest_of_its_micro_batch():
    # rows nearly free: the cap, what is left of one n_ubatch
    assert prefill_rows(_table(lambda r: 0.010 + 1e-7 * r), 20, True, 512, 2048) == 512 - 20


def test_a_prompt_always_gets_on_and_never_past_the_batch():
    steep = _table(lambda r: 0.0001 + 0.01 * r)
    assert prefill_rows(steep, 4, True, 512, 2048) == PREFILL_MIN_ROWS  # 4 rows at the slope: too few
    assert prefill_rows(steep, 2040, True, 512, 2048) == 8  # n_batch - the step's rows
    assert prefill_rows(CostTable(), 20, True, 64, 2048) == 64 - 20  # nothing measured: the cap
