"""do_bench's budgets on a GPU: cut to MAX_SAMPLES repetitions for a small kernel, left
as the spec gives them for one whose budget buys fewer (the GPU path itself runs in
benchmarks/heavy_compiles.py, on an H200)."""

from __future__ import annotations

import pytest

from actors.timing import MAX_SAMPLES, capped


def test_a_small_kernels_budget_buys_at_most_max_samples_repetitions_warm_up_in_proportion():
    warmup, rep = capped(25.0, 100.0, repetition_ms=0.05)  # 2000 repetitions uncut
    assert rep == pytest.approx(MAX_SAMPLES * 0.05)
    assert warmup / rep == pytest.approx(25.0 / 100.0)


def test_a_budget_that_buys_fewer_repetitions_than_the_cap_stands():
    assert capped(25.0, 100.0, repetition_ms=2.0) == (25.0, 100.0)  # 50 repetitions
    assert capped(5.0, 20.0, repetition_ms=None) == (5.0, 20.0)  # not measured
    assert capped(5.0, 20.0, repetition_ms=0.0) == (5.0, 20.0)  # an event pair said 0
