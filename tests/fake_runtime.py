"""An in-process Runtime (sweep/engines/runtime.py) with a clock the test controls.

Workers are scripted: `trial(index, config, attempt, worker)` says what each trial does
(take some seconds and succeed or fail, kill its worker, hang) and `start(worker)` what a
worker's start-up does (take some seconds, fail in its constructor, die, never be placed).
Time moves only inside poll() and settle(): each jumps the clock to the next scheduled
event, or by the timeout when none is due, so a test of a 60 s timeout takes microseconds
and every run of it is the same.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.protocol import CompileLimit, Retimed, Timing
from storage.records import TrialOutcome, TrialRecord, Where
from sweep.engines.runtime import (
    BatchBegan,
    BatchDone,
    Event,
    Trial,
    TrialBegan,
    TrialsDone,
    WorkerLost,
    WorkerUp,
)


@dataclass(frozen=True)
class Ok:
    seconds: float = 1.0
    latency_ms: float = 1.0
    compile_ms: float | None = None


@dataclass(frozen=True)
class Fails:
    status: str = "compile_error"
    seconds: float = 1.0


@dataclass(frozen=True)
class Dies:
    """The worker process dies `seconds` into the trial. Messages sent just before a death
    can be lost: with lose_records=N the last N records of the batch never arrive."""

    seconds: float = 1.0
    lose_records: int = 0
    lose_start: bool = False  # its start is never announced (order mode)


KILLED = "its process (pid 4242) died: killed by SIGKILL"  # a scripted death's why


@dataclass(frozen=True)
class Hangs:
    pass


TrialScript = Ok | Fails | Dies | Hangs


@dataclass(frozen=True)
class Start:
    seconds: float = 1.0
    init_fails: bool = False  # its constructor raises
    dies: bool = False  # killed during start-up (before it is up)
    never: bool = False  # cannot be placed: no event, ever


@dataclass
class _Worker:
    name: str
    up_at: float | None  # None: never up
    free_at: float  # when it can begin its next batch
    doomed: bool = False  # a scheduled death or hang: nothing after it runs
    began: int = 0  # trials announced


@dataclass
class FakeRuntime:
    trial: Callable[[int, dict[str, Any], int, str], TrialScript] = lambda *_: Ok()
    start_script: Callable[[str], Start] = lambda _: Start()
    freezes: Callable[[str, int], bool] = lambda *_: False  # (worker, batch): never begins it
    # (worker, batch): its stream never ends after the last record (a frozen worker)
    hangs_after: Callable[[str, int], bool] = lambda *_: False
    give_up_at: float = 1e6  # a driver still polling then never would have finished
    # Workers that run a batch's trials in another order and announce each start, as
    # workers with a compile pool do: order(trials) gives the order they run in.
    order: Callable[[list[Trial]], list[Trial]] | None = None
    device: str = "fake-gpu"
    epoch: float = 1_700_000_000.0
    now: float = 0.0
    wall_offset: float = 0.0  # a step of the wall clock, for tests that make one
    started: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    submitted: list[tuple[str, int, list[int]]] = field(default_factory=list)
    limits: list[CompileLimit | None] = field(default_factory=list)
    pushed: list[tuple[str, CompileLimit]] = field(default_factory=list)  # by set_limit
    retimed: list[tuple[str, list[dict[str, Any]], int]] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)  # the kind each worker was started as
    _workers: dict[str, _Worker] = field(default_factory=dict)
    _events: list[tuple[float, int, Event]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    # --- the Runtime protocol --------------------------------------------------------------
    def start(self, worker: str, kind: str = "") -> None:
        script = self.start_script(worker)
        self.started.append(worker)
        self.kinds[worker] = kind
        at = self.now + script.seconds
        if script.never:
            self._workers[worker] = _Worker(worker, None, math.inf, doomed=True)
        elif script.init_fails or script.dies:
            self._workers[worker] = _Worker(worker, None, math.inf, doomed=True)
            why = "constructor raised" if script.init_fails else "killed while starting"
            self._at(at, WorkerLost(worker, why, init_failed=script.init_fails))
        else:
            self._workers[worker] = _Worker(worker, at, at)
            self._at(at, WorkerUp(worker, kind or self.device, "fake-node",
                                  {"torch": f"torch-on-{kind or self.device}"}))

    def submit(self, worker: str, batch: int, trials: Sequence[Trial],
               ahead: Sequence[tuple[int, dict[str, Any]]],
               limit: CompileLimit | None = None) -> None:
        self.submitted.append((worker, batch, [t[0] for t in trials]))
        self.limits.append(limit)
        w = self._workers.get(worker)
        if w is None or w.doomed:
            return
        if self.freezes(worker, batch):
            w.doomed = True
            return
        t = max(w.free_at, self.now)
        self._at(t, BatchBegan(worker, batch))
        done: list[TrialsDone] = []
        for index, config, attempt in (self.order(list(trials)) if self.order else trials):
            script = self.trial(index, config, attempt, worker)
            if self.order is not None:
                if not (isinstance(script, Dies) and script.lose_start):
                    self._at(t, TrialBegan(worker, batch, index, w.began, ahead=True))
                w.began += 1
            if isinstance(script, Hangs):
                w.doomed = True
                return
            if isinstance(script, Dies):
                lost = {id(e) for e in done[len(done) - script.lose_records:]} \
                    if script.lose_records else set()
                self._events = [e for e in self._events if id(e[2]) not in lost]
                heapq.heapify(self._events)
                self._at(t + script.seconds, WorkerLost(worker, KILLED))
                w.doomed = True
                return
            t += script.seconds
            done.append(TrialsDone(worker, batch, (self._record(worker, index, config,
                                                                attempt, script, t),), (None,)))
            self._at(t, done[-1])
        if self.hangs_after(worker, batch):
            w.doomed = True
            return
        self._at(t, BatchDone(worker, batch))
        w.free_at = t

    def poll(self, timeout_s: float) -> list[Event]:
        assert self.now < self.give_up_at, "the driver never finished"
        if self._events and self._events[0][0] <= self.now + timeout_s:
            self.now = max(self.now, self._events[0][0])
            return self._due()
        self.now += timeout_s
        return []

    def settle(self, worker: str, timeout_s: float) -> list[Event]:
        mine = [e for e in self._events if e[2].worker == worker
                and e[0] <= self.now + timeout_s and not isinstance(e[2], WorkerLost)]
        self._events = [e for e in self._events if e not in mine]
        heapq.heapify(self._events)
        return [e for _, _, e in sorted(mine, key=lambda e: (e[0], e[1]))]

    def set_limit(self, worker: str, limit: CompileLimit) -> None:
        self.pushed.append((worker, limit))

    def kill(self, worker: str) -> None:
        if self._workers.pop(worker, None) is not None:
            self.killed.append(worker)
        self._events = [e for e in self._events if e[2].worker != worker]
        heapq.heapify(self._events)

    def retime(self, worker: str, configs: Sequence[dict[str, Any]], rounds: int,
               timeout_s: float, should_stop: Callable[[], bool]) -> Retimed:
        self.retimed.append((worker, list(configs), rounds))
        return Retimed([Timing(0.5, 0.4, 0.6) for _ in configs])

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.epoch + self.now + self.wall_offset

    # --- scheduling ----------------------------------------------------------------------
    def _at(self, t: float, event: Event) -> None:
        heapq.heappush(self._events, (t, next(self._seq), event))

    def _due(self) -> list[Event]:
        out = []
        while self._events and self._events[0][0] <= self.now:
            out.append(heapq.heappop(self._events)[2])
        for event in out:
            if isinstance(event, WorkerLost):
                self._workers.pop(event.worker, None)
        return out

    def _record(self, worker: str, index: int, config: dict[str, Any], attempt: int,
                script: Ok | Fails, finished: float) -> TrialRecord:
        if isinstance(script, Ok):
            outcome = TrialOutcome("ok", "passed", latency_ms=script.latency_ms,
                                   latency_p20_ms=script.latency_ms,
                                   latency_p80_ms=script.latency_ms,
                                   compile_ms=script.compile_ms)
        else:
            outcome = TrialOutcome(script.status, "skipped", error="scripted")  # type: ignore[arg-type]
        return TrialRecord.from_outcome(
            index, config, outcome, where=Where(self.device, "fake-node", worker),
            attempt=attempt, started_at=self.epoch + finished - script.seconds,
            finished_at=self.epoch + finished)
