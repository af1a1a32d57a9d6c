"""The finalists' re-timing races them: one 3% or more slower than the fastest after a
round sits out the rounds left (actors/triton_backend.py), and the pick is among those
timed in every round (sweep/run/finish.py)."""

from __future__ import annotations

from actors.protocol import Timing
from actors.triton_backend import Budgets, TritonBackend, still_racing
from storage.records import Best
from sweep.run.finish import pick
from sweep_kernels import load_kernel

PROBLEM = {"M": 32, "N": 32, "K": 32, "dtype": "float16"}
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1}


def test_a_finalist_within_the_margin_races_on_and_one_past_it_sits_out():
    samples = [[1.00], [1.029], [1.031], [0.99, 1.04]]
    assert still_racing(samples, [0, 1, 2, 3]) == [0, 1, 3]  # 3's median so far: 1.015
    assert still_racing([[1.0], [0.9]], [0, 1]) == [1]


def scripted_backend(monkeypatch, medians: list[float]):
    """An interpreter backend whose timings are `medians`, in the order asked for; and the
    iterator, to check every one was asked for."""
    backend = TritonBackend(load_kernel("matmul"), PROBLEM, interpret=True,
                            timing=Budgets((1, 1), (1, 1)), tolerance=None, seed=0)
    left = iter(medians)

    def scripted(launch, warmup_ms, rep_ms, first_ms=None, screen=False):
        median = next(left)
        return Timing(median, median, median)

    monkeypatch.setattr(backend, "_time", scripted)
    return backend, left


def test_the_re_timing_times_a_slow_finalist_in_its_first_round_only(monkeypatch):
    configs = [{**CONFIG, "GROUP_M": g} for g in (1, 2, 4)]
    # Timed in rotation, torch's baseline last in each round: finalist 1 (GROUP_M 2) is
    # 10% slower in the first, and is not timed again.
    backend, medians = scripted_backend(
        monkeypatch, [1.0, 1.1, 1.01, 5.0, 1.0, 1.01, 5.0, 1.0, 1.01, 5.0])
    retimed = backend.retime(configs, rounds=3)
    assert next(medians, None) is None  # every scripted timing was asked for
    assert retimed.rounds == [3, 1, 3]
    assert [t.median_ms for t in retimed.finalists] == [1.0, 1.1, 1.01]
    assert retimed.baseline is not None and retimed.baseline.median_ms == 5.0


def test_a_race_left_with_one_finalist_ends_there(monkeypatch):
    configs = [{**CONFIG, "GROUP_M": g} for g in (1, 2)]
    # finalist 1 is 10% behind; the baseline last
    backend, medians = scripted_backend(monkeypatch, [1.0, 1.1, 5.0])
    retimed = backend.retime(configs, rounds=3)
    assert next(medians, None) is None  # nothing timed after the first round
    assert retimed.rounds == [1, 1]
    assert pick([Best(k, c, 1.0, "d") for k, c in enumerate(configs)], retimed.finalists,
                retimed.rounds).index == 0


def test_the_pick_is_among_the_finalists_timed_in_every_round():
    leaders = [Best(k, {"A": k}, 1.0, "H200") for k in range(3)]
    timings = [Timing(1.2, 1.1, 1.3), Timing(1.0, 1.0, 1.0), Timing(1.1, 1.0, 1.2)]
    # Finalist 1's one round was a cool one: its median is no fair match for theirs.
    assert pick(leaders, timings, [3, 1, 3]) == Best(2, {"A": 2}, 1.1, "H200")
    assert pick(leaders, timings, [3, 3, 3]) == Best(1, {"A": 1}, 1.0, "H200")


def test_the_report_ranks_a_finalist_that_sat_out_rounds_after_the_winner():
    from sweep.report.ranking import Chose, rank_trials

    rows = [{"index": k, "config": f'{{"A": {k}}}', "device": "H200", "latency_ms": 1.0,
             "latency_p20_ms": 1.0, "latency_p80_ms": 1.0} for k in range(3)]
    timing = {"latency_p20_ms": 1.0, "latency_p80_ms": 1.2}
    chose = Chose(1, {0: {"latency_ms": 1.0, **timing, "rounds": 1},
                      1: {"latency_ms": 1.1, **timing, "rounds": 3}}, {1}, {})
    ranked = rank_trials(rows, chose, {})
    assert [(r.index, r.winner) for r in ranked] == [(1, True), (0, False), (2, False)]
