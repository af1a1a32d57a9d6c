"""What the driver knows of each worker's place: the batches it holds, the trial it runs
and since when, how its starts went, and from that when it is overdue.

A slot outlives the workers that fill it: a worker replaced after a death or a timeout
leaves its slot's failures counted for the next one.

Workers with a compile pool run whichever of their configs has compiled first and announce
each trial as it begins (TrialBegan); for them "running" is what was announced last (and
with nothing announced, a death falls on the first unfinished trial of the oldest batch
begun, as the announcement may have died with the worker). Other workers run trials in
the order sent, and the first unfinished one is running.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from storage.records import TrialOutcome, TrialRecord, Where
from sweep.engines.runtime import Trial
from sweep.run.contracts import Limits


@dataclass
class HeldBatch:
    """A batch sent to a worker: the trials of it not reported yet."""

    number: int
    trials: list[Trial]  # those not reported yet
    probation: bool = False  # a lone suspect: a death now is certainly its own
    sent_at: float = 0.0  # when it was sent (the runtime's monotonic clock)
    started: bool = False

    @property
    def pending(self) -> bool:
        return bool(self.trials)

    def unfinished(self) -> list[Trial]:
        return self.trials

    def find(self, index: int) -> int | None:
        for k, trial in enumerate(self.trials):
            if trial[0] == index:
                return k
        return None

    def take(self, records: Sequence[TrialRecord]) -> set[int]:
        """Mark these records' trials reported; returns the indices that were pending
        here (a record for anything else is stale and ignored)."""
        reported = {r.index for r in records}
        done = {t[0] for t in self.trials if t[0] in reported}
        if done:
            self.trials = [t for t in self.trials if t[0] not in done]
        return done


@dataclass(frozen=True)
class Stalled:
    """An overdue slot where nothing began (its worker finished a batch and never began the
    next, or waited on compiles past their limit): the worker, not a trial, stopped (a
    frozen process, a lost message). Nobody is to blame."""

    why: str  # what the user is told


@dataclass(frozen=True)
class TimedOut:
    """An overdue slot's trial ran past the trial timeout: recorded `timeout`."""

    trial: Trial
    why: str  # what the user is told
    error: str  # the row's


@dataclass
class Slot:
    """A place for one worker; it outlives the workers that fill it."""

    name: str = ""
    kind: str = ""  # the device type its workers ask for ("" any)
    batches: deque[HeldBatch] = field(default_factory=deque)
    device: str = "unknown"
    node: str = "unknown"
    up: bool = False
    born: float = 0.0  # when its worker was started
    since: float = 0.0  # when its current trial became due (monotonic)
    sent: int = 0  # batches sent to this worker
    failed_starts: int = 0
    running: int | None = None  # the trial it announced last and has not reported
    began: int = -1  # the ordinal of that announcement

    @property
    def on_probation(self) -> bool:
        return any(b.probation for b in self.batches)

    def unfinished(self) -> list[Trial]:
        return [t for b in self.batches for t in b.unfinished()]

    def waiting(self) -> list[tuple[int, float]]:
        """(index, when sent) of each trial it holds that has not begun: still to compile,
        or compiled and waiting for the device."""
        return [(t[0], b.sent_at) for b in self.batches for t in b.trials
                if t[0] != self.running]

    def head(self) -> HeldBatch | None:
        """The batch whose trial is due now."""
        return next((b for b in self.batches if b.pending), None)

    def batch(self, number: int) -> HeldBatch | None:
        return next((b for b in self.batches if b.number == number), None)

    def has_room(self, limits: Limits) -> bool:
        if len(self.batches) >= limits.max_batches:
            return False
        if not limits.announced:
            return True
        held = sum(len(b.trials) for b in self.batches)
        return held <= (limits.depth - 1) * limits.batch_size

    def current(self, announced: bool) -> tuple[HeldBatch, Trial] | None:
        """The trial the worker is running now, as far as the driver knows: the one it
        announced, or (for workers that run in order) the first unfinished one."""
        if announced:
            for batch in self.batches:
                k = batch.find(self.running) if self.running is not None else None
                if k is not None:
                    return batch, batch.trials[k]
            return None
        head = self.head()
        return (head, head.trials[0]) if head is not None else None

    def guess(self, announced: bool) -> tuple[HeldBatch, Trial] | None:
        """A worker that announces its trials died with none announced running: the
        message saying which began may have died with it (else a config that kills its
        worker at once could go round forever). The first unfinished trial of the oldest
        batch it began (or, once up, held) is a suspect, as for workers that run in order;
        alone on probation, a suspect is certainly to blame."""
        if not announced:
            return None
        began = next((b for b in self.batches if b.started and b.trials), None) or \
            (self.head() if self.up else None)
        return (began, began.trials[0]) if began is not None else None

    def allowance(self, limits: Limits) -> float:
        """How long the slot may go without progress: a trial's timeout, and for a worker
        waiting on its compiles (nothing announced) the compile limit on top."""
        waiting = limits.announced and self.running is None
        return limits.trial_timeout_s + (limits.compile_wait_s if waiting else 0.0)

    def overdue(self, limits: Limits, now: float) -> bool:
        return self.up and self.head() is not None and now - self.since >= self.allowance(limits)

    def verdict(self, limits: Limits, now: float) -> Stalled | TimedOut | None:
        """What an overdue slot's worker is ended for (it is, either way); None if it is
        not overdue."""
        if not self.overdue(limits, now):
            return None
        current = self.current(limits.announced)
        if current is None or not current[0].started:
            waiting = limits.announced and self.running is None
            rule = f"run.trial_timeout_s {limits.trial_timeout_s:g} s" + (
                f" + the compile limit {limits.compile_wait_s:g} s" if waiting else "")
            where = "waiting on compiles" if limits.announced else "between batches"
            return Stalled(f"worker {self.name} made no progress for "
                           f"{self.allowance(limits):g} s {where} ({rule}): the driver ends it "
                           "and starts another")
        trial = current[1]
        return TimedOut(
            trial, f"trial {trial[0]} ran past run.trial_timeout_s "
            f"({limits.trial_timeout_s:g} s) on worker {self.name}: the driver ends that "
            "worker and starts another",
            f"no result within run.trial_timeout_s={limits.trial_timeout_s:g} s (the driver "
            "ended its worker)")

    def record(self, index: int, config: dict[str, Any], attempt: int, outcome: TrialOutcome,
               wall: float, now: float) -> TrialRecord:
        """The record of a trial whose worker could not report it (a timeout, a crash),
        begun when it became due."""
        return TrialRecord.from_outcome(
            index, config, outcome, where=Where(self.device, self.node, self.name),
            attempt=attempt, started_at=wall - (now - self.since), finished_at=wall)
