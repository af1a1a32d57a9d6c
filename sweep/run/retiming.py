"""Re-timing once a sweep's trials are done: finalists side by side on one worker of a
device type, so they share one device's conditions, and a successive-halving rung spread
over every worker of it at once. Functions over the run's workers (sweep/run/workers.py),
which the finish (sweep/run/finish.py) calls after the trial loop."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from actors.protocol import Retimed, Timing
from sweep.run.workers import WorkerPool


def retime(workers: WorkerPool, configs: list[dict[str, Any]], rounds: int,
           should_stop: Callable[[], bool], device: str | None = None) -> Retimed:
    """Re-time finalists interleaved on one worker, so they share one device's conditions:
    one of the given device type, if any; with them the kernel's torch baseline, where the
    backend runs one. Call after a complete run, before the driver's close()."""
    slot = workers.worker_on(device)
    # Each round times every finalist once: about one trial's worth of work.
    return workers.runtime.retime(slot.name, configs, rounds,
                                  rounds * workers.limits.trial_timeout_s, should_stop)


def retime_spread(workers: WorkerPool, configs: list[dict[str, Any]], device: str,
                  should_stop: Callable[[], bool]) -> list[Timing]:
    """Time each config once more with the careful timing, spread over every worker up on
    the device type at once (a successive-halving rung, see sweep/search/strategies.py);
    the timings in the configs' order."""
    slots = [s for s in workers.slots if s.up and s.device == device] or \
        [workers.worker_on(device)]
    shares = [configs[k::len(slots)] for k in range(len(slots))]
    limit = workers.limits.trial_timeout_s
    with ThreadPoolExecutor(len(slots), thread_name_prefix="rung") as pool:
        results = list(pool.map(
            lambda slot, share: workers.runtime.retime(
                slot.name, share, 1, max(1, len(share)) * limit, should_stop)
            if share else Retimed([]), slots, shares))
    out: list[Timing] = [Timing(float("inf"), float("inf"), float("inf"))] * len(configs)
    for k, retimed in enumerate(results):
        for j, timing in enumerate(retimed.finalists):
            out[k + j * len(slots)] = timing
    return out
