"""How to time one launch function: CUDA events through Triton on a GPU, the wall clock on
the CPU interpreter. Both report the median with p20/p80 so the noise stays visible."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from actors.protocol import Timing

# Below this the launch overhead is a large share of what do_bench measures: replay a
# CUDA graph instead, which launches back to back from the GPU's own queue.
GRAPH_BELOW_MS = 0.02


def time_cuda(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> Timing:
    import triton.testing

    # do_bench flushes L2 between repetitions and times each with CUDA events.
    median, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                               quantiles=[0.5, 0.2, 0.8])
    if median < GRAPH_BELOW_MS:
        median, p20, p80 = triton.testing.do_bench_cudagraph(fn, rep=rep_ms,
                                                             quantiles=[0.5, 0.2, 0.8])
    return Timing(float(median), float(p20), float(p80))


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
