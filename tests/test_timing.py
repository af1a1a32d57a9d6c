"""CUDA timing without a GPU (a scripted clock stands in for torch's events): each
repetition timed after its L2 flush, sized by one flushed repetition, at most MAX_SAMPLES
of them for a small kernel. On a GPU it runs in benchmarks/heavy_compiles.py."""

from __future__ import annotations

import sys
import types

import pytest

from actors import timing
from actors.timing import MAX_SAMPLES, capped


def test_a_small_kernels_budget_buys_at_most_max_samples_repetitions_warm_up_in_proportion():
    warmup, rep = capped(25.0, 100.0, repetition_ms=0.05)  # 2000 repetitions uncut
    assert rep == pytest.approx(MAX_SAMPLES * 0.05)
    assert warmup / rep == pytest.approx(25.0 / 100.0)


def test_a_budget_that_buys_fewer_repetitions_than_the_cap_stands():
    assert capped(25.0, 100.0, repetition_ms=2.0) == (25.0, 100.0)  # 50 repetitions
    assert capped(5.0, 20.0, repetition_ms=None) == (5.0, 20.0)  # not measured
    assert capped(5.0, 20.0, repetition_ms=0.0) == (5.0, 20.0)  # an event pair said 0


class FakeGpu:
    """A GPU clock for time_cuda without a GPU: a launch takes kernel_ms, a flush flush_ms,
    and an event records the clock when it is recorded."""

    def __init__(self, kernel_ms: float, flush_ms: float, jitter: tuple[float, ...] = (0.0,),
                 ) -> None:
        """jitter: added to kernel_ms launch after launch, in turn."""
        self.kernel_ms, self.flush_ms, self.now, self.launches = kernel_ms, flush_ms, 0.0, 0
        self.jitter = jitter
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = gpu.now

            def elapsed_time(self, end: Event) -> float:
                return end.at - self.at

            def synchronize(self) -> None:
                pass

        class Buffer:
            def zero_(self) -> None:
                gpu.now += gpu.flush_ms

        self.torch = types.SimpleNamespace(
            cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None),
            empty=lambda *args, **kwargs: Buffer(), int32="int32")

    def launch(self) -> None:
        self.now += self.kernel_ms + self.jitter[self.launches % len(self.jitter)]
        self.launches += 1


def timed(monkeypatch, gpu: FakeGpu, warmup_ms: float, rep_ms: float, screen: bool = False):
    monkeypatch.setitem(sys.modules, "torch", gpu.torch)
    monkeypatch.setattr(timing, "_flush", [])
    return timing.time_cuda(gpu.launch, warmup_ms, rep_ms, screen)


def test_each_repetition_is_timed_after_its_flush_sized_by_one_flushed_repetition(monkeypatch):
    gpu = FakeGpu(kernel_ms=2.0, flush_ms=0.5)
    t = timed(monkeypatch, gpu, warmup_ms=5.0, rep_ms=20.0)
    assert (t.median_ms, t.p20_ms, t.p80_ms) == (2.0, 2.0, 2.0)  # the flush is not in it
    # one repetition to size it (2.5 ms), 2 warm-ups in 5 ms, 8 repetitions in 20 ms
    assert gpu.launches == 1 + 2 + 8


def test_a_small_kernel_gets_max_samples_repetitions_however_long_the_budget(monkeypatch):
    gpu = FakeGpu(kernel_ms=0.05, flush_ms=0.05)
    timed(monkeypatch, gpu, warmup_ms=25.0, rep_ms=100.0)  # 1000 repetitions uncut
    assert gpu.launches == 1 + 25 + MAX_SAMPLES  # warm-up cut in proportion: 2.5 ms


def test_a_screen_ends_once_its_median_is_known_and_a_careful_timing_does_not(monkeypatch):
    steady = FakeGpu(kernel_ms=2.0, flush_ms=0.5)
    t = timed(monkeypatch, steady, warmup_ms=5.0, rep_ms=100.0, screen=True)
    assert t.median_ms == 2.0
    assert steady.launches == 1 + 2 + timing.SCREEN_FIRST  # not the budget's 40
    careful = FakeGpu(kernel_ms=2.0, flush_ms=0.5)
    timed(monkeypatch, careful, warmup_ms=5.0, rep_ms=100.0)
    assert careful.launches == 1 + 2 + 40


def test_a_noisy_screen_goes_on_doubling_its_repetitions_to_its_budget(monkeypatch):
    # every other launch 20% slower: the median is never known to 1% in 40 repetitions
    noisy = FakeGpu(kernel_ms=2.0, flush_ms=0.5, jitter=(0.0, 0.4))
    timed(monkeypatch, noisy, warmup_ms=5.0, rep_ms=100.0, screen=True)
    assert noisy.launches == 1 + 2 + 40
    # 10% apart: not known from five; from forty, to 1%
    assert not timing.known([2.0, 2.2] * 2 + [2.0])
    assert timing.known([2.0, 2.2] * 20)
