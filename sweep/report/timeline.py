"""Where each worker's time went (its trials, its waits, its session's start): apart from
the rest of the analysis because only the timeline plots and the workers' lines read it."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Span:
    """A stretch of one worker's time: a trial, the wait between two of its trials within
    one session (for compiles, or for work), or its session's start before its first
    trial (Ray, the workers and the first compiles starting)."""

    worker: str  # "node/worker", with "sN " in front when the run had several sessions
    start_s: float  # since the run's first session began (its first trial, if unknown)
    end_s: float
    kind: str  # a trial's status, "waiting", "starting" or "re-timing" (the finalists)
    index: int | None  # the trial's


@dataclass(frozen=True)
class WorkerUse:
    """How much of one worker's time went to running trials."""

    worker: str
    device: str
    trials: int
    busy_s: float  # running trials
    waiting_s: float  # between its first trial's start and its last's end, not running one
    busy_fraction: float  # busy / (busy + waiting)
    starting_s: float | None  # from its session's start to its first trial, where known


def worker_timeline(rows: list[dict[str, Any]], starts: list[float], t0: float
                    ) -> tuple[list[Span], list[WorkerUse]]:
    """Each worker's trials and the waits between them, per session: workers of a
    resumed run take the same names again, and the time between sessions is nobody's
    wait. t0: time zero (seconds since the epoch)."""
    lanes: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        begun = r["started_at"].timestamp()
        session = max(bisect.bisect_right(starts, begun) - 1, 0)
        lanes.setdefault((session, r["node"], r["worker"]), []).append(r)
    several = len({s for s, _, _ in lanes}) > 1
    spans, uses = [], []
    for (session, node, worker), trials in sorted(lanes.items()):
        name = f"s{session + 1} {node}/{worker}" if several else f"{node}/{worker}"
        trials.sort(key=lambda r: (r["started_at"], r["index"]))
        busy = waiting = 0.0
        previous_end: float | None = None
        starting = None
        if starts and starts[session] <= trials[0]["started_at"].timestamp():
            starting = trials[0]["started_at"].timestamp() - starts[session]
            spans.append(Span(name, starts[session] - t0, starts[session] - t0 + starting,
                              "starting", None))
        for r in trials:
            start = r["started_at"].timestamp() - t0
            end = max(r["finished_at"].timestamp() - t0, start)
            if previous_end is not None and start > previous_end:
                spans.append(Span(name, previous_end, start, "waiting", None))
                waiting += start - previous_end
            spans.append(Span(name, start, end, r["status"], r["index"]))
            busy += end - start
            previous_end = end if previous_end is None else max(previous_end, end)
        total = busy + waiting
        uses.append(WorkerUse(name, trials[0]["device"], len(trials), busy, waiting,
                              busy / total if total > 0 else 1.0, starting))
    return spans, uses


def retiming(timeline: dict[str, float], sessions: int, t0: float) -> list[Span]:
    """The last session's re-timing of its finalists (on one worker of each device type,
    after the last trial), on a lane of its own: seconds of the command no trial shows."""
    begun, done = timeline.get("trials_done"), timeline.get("finalists_done")
    if begun is None or done is None or done < begun:
        return []
    lane = f"s{sessions} finalists" if sessions > 1 else "finalists"
    return [Span(lane, begun - t0, done - t0, "re-timing", None)]
