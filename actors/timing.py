"""How to time one launch function: CUDA events on a GPU (torch's, as Triton's do_bench
uses them), the wall clock on the CPU interpreter. Both report the median with p20/p80 so
the noise stays visible."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from actors.protocol import Timing

# Below this the launch overhead is a large share of what do_bench measures: replay a
# CUDA graph instead, which launches back to back from the GPU's own queue.
GRAPH_BELOW_MS = 0.02
# Past this many repetitions a budget buys no better median (its standard error shrinks as
# one over the root of the count) but costs as much again: rep_ms 100 is over a thousand
# repetitions of a kernel of tens of microseconds, each behind an L2 flush: on an H200 the
# finalists' re-timing took 10 s of a 35 s sweep over eight shapes, most of them that
# small (benchmarks/results/heavy_compiles_adopt-2026-12-03.json). do_bench's budgets
# are in ms, so they are cut to this many of one repetition's time (see capped).
MAX_SAMPLES = 100
FLUSH_BYTES = 256 * 1024 * 1024  # what do_bench clears L2 with
# A screen (each config's quick first timing, where the finalists are re-timed carefully)
# ends once its median's standard error is under SCREEN_PRECISION of it, looked at after
# SCREEN_FIRST flushed repetitions and each time their count doubles. The screen only
# chooses the finalists: on an H200 a 1.6 ms matmul's repetitions spread 0.6% (p20 to
# p80), so five of them knew the median to 0.2%, and a config took 32 ms (the median),
# most of it its screen's fourteen launches; the 8 sizes of configs/matmul-shapes.yaml
# spread 1-5% (benchmarks/results/heavy_compiles_head_runs).
SCREEN_PRECISION = 0.01
SCREEN_FIRST = 5


def capped(warmup_ms: float, rep_ms: float, repetition_ms: float | None) -> tuple[float, float]:
    """do_bench's (warmup_ms, rep_ms) for a kernel one repetition of which (L2 flush and
    launch, as do_bench counts it) takes repetition_ms: at most MAX_SAMPLES repetitions,
    the warm-up cut in the same proportion."""
    if repetition_ms is None or not repetition_ms > 0 or rep_ms <= 0:
        return warmup_ms, rep_ms
    rep = min(rep_ms, MAX_SAMPLES * repetition_ms)
    return warmup_ms * rep / rep_ms, rep


_flush: list[Any] = []  # the L2 flush buffer, made once per process


def _flushed() -> Any:
    """The buffer whose zeroing flushes L2, as do_bench's does (one per process)."""
    import torch

    if not _flush:
        _flush.append(torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda"))
    return _flush[0]


def repetition_ms(fn: Callable[[], object]) -> float:
    """One repetition as do_bench times one: L2 flushed, then fn, between CUDA events."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    flush = _flushed()
    start.record()
    flush.zero_()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def time_cuda(fn: Callable[[], object], warmup_ms: float, rep_ms: float,
              screen: bool = False) -> Timing:
    """Timed as triton.testing.do_bench times (warm-up launches, then each repetition
    behind an L2 flush between its own CUDA events), but sized by one repetition rather
    than by do_bench's first launch and five more: five launches fewer a config, where a
    screen of a 2 ms matmul is about eighteen and the GPU is a sweep's bottleneck. At
    most MAX_SAMPLES flushed repetitions (see capped); a screen's end once its median is
    known (see SCREEN_PRECISION). The median and p20/p80."""
    import torch

    one = repetition_ms(fn)  # fn has run: the caller's validating launch, or this one
    warmup_ms, rep_ms = capped(warmup_ms, rep_ms, one)
    one = max(one, 1e-3)
    for _ in range(max(1, int(warmup_ms / one))):
        fn()
    n = min(max(1, int(rep_ms / one)), MAX_SAMPLES)
    flush = _flushed()
    samples: list[float] = []
    batch = min(SCREEN_FIRST, n) if screen else n
    while batch:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        for start, end in zip(starts, ends):
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        samples += [float(s.elapsed_time(e)) for s, e in zip(starts, ends)]
        batch = 0 if screen and known(samples) else min(len(samples), n - len(samples))
    timing = summarise(samples)
    if timing.median_ms < GRAPH_BELOW_MS:
        import triton.testing

        median, p20, p80 = triton.testing.do_bench_cudagraph(fn, rep=rep_ms,
                                                             quantiles=[0.5, 0.2, 0.8])
        return Timing(float(median), float(p20), float(p80))
    return timing


def known(samples: list[float]) -> bool:
    """Whether the samples' median is known to SCREEN_PRECISION: its standard error (by the
    normal approximation, 1.2533 sigma over the root of the count) under that share of it."""
    if len(samples) < 2:
        return False
    median = statistics.median(samples)
    error = 1.2533 * statistics.stdev(samples) / len(samples) ** 0.5
    return median > 0 and error <= SCREEN_PRECISION * median


def summarise(samples: list[float]) -> Timing:
    if len(samples) < 2:
        return Timing(samples[0], samples[0], samples[0])
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return Timing(statistics.median(samples), q[1], q[7])


def time_wall(fn: Callable[[], object], warmup_ms: float, rep_ms: float,
              max_reps: int = 100, first_ms: float | None = None) -> Timing:
    """do_bench's budget semantics on the host clock: estimate one call, then warm up for
    warmup_ms and measure for rep_ms, with at least three samples. first_ms: a call the
    caller has just made and timed (the interpreter's validating launch): the estimate,
    and the first sample too where the warm-up budget is under one call (then no call
    would come between it and the samples; the median of three stands one slow first)."""
    samples = []
    if first_ms is None:
        start = time.perf_counter()
        fn()
        estimate_ms = (time.perf_counter() - start) * 1e3
    else:
        estimate_ms = first_ms
    estimate_ms = max(estimate_ms, 1e-3)
    warmups = int(warmup_ms / estimate_ms)
    if first_ms is not None and warmups == 0:
        samples.append(first_ms)
    for _ in range(warmups):
        fn()
    for _ in range(max(3, min(max_reps, int(rep_ms / estimate_ms))) - len(samples)):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarise(samples)
