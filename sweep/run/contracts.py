"""What the driver is handed by its session, and hands on: the work it runs and the limits
it runs under (Work, Limits), where finished trials go (a TrialLog, durably, before they
count) and who is told of them (an Observer)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from storage.records import TrialRecord
from sweep.results.tally import Tally
from sweep.search.scheduling import AdaptiveLimit
from sweep.spec.space import Space

# How the driver's trial loop ended (Driver.run); the session's own end is request.py's
# SessionEnd.
DriverEnd = Literal["complete", "stopped", "budget"]


@dataclass(frozen=True)
class SpentAttempt:
    """An attempt that ended without a record: its worker "died", or the run was
    "interrupted" while it ran. Resume numbers the next attempt after it. why: how the
    worker died, in one line."""

    index: int
    attempt: int
    event: Literal["died", "interrupted"]
    why: str | None = None


class TrialLog(Protocol):
    """Where finished trials go: durably, before they count (see sweep/run/rundir.py). lines:
    each record's journal line where its worker encoded it (else None), aligned with
    records: encoding is most of the driver's cost per trial, and workers run in parallel."""

    def commit(self, records: list[TrialRecord], attempts: list[SpentAttempt],
               lines: list[bytes | None]) -> None: ...


class Observer(Protocol):
    """A narrow hook for progress displays and the like; called on the driver's thread."""

    def on_records(self, records: list[TrialRecord], tally: Tally) -> None: ...

    def on_event(self, message: str) -> None: ...


@dataclass(frozen=True)
class Limits:
    trial_timeout_s: float
    max_retries: int
    drain_s: float
    snapshot_every_s: float
    batch_size: int = 1
    depth: int = 2
    max_trials: int | None = None
    start_timeout_s: float = 60.0
    hint_span: int = 0  # how far down the queue idle compile pools may look
    max_failed_starts: int = 3  # consecutive deaths of one slot's workers before any trial
    announced: bool = False  # workers announce each trial's start and may run any order
    compile_wait_s: float = 0.0  # how long such a worker may wait on compiles, past the
    # trial timeout, before it is replaced (the compile limit bounds a wait)

    @property
    def max_batches(self) -> int:
        """Batches a worker may hold at once. One that runs its trials in any order gets
        a new batch whenever a batch's worth of its trials is done, even if a slow compile
        keeps an older batch open: held batches are then more than depth."""
        return 4 * self.depth if self.announced else self.depth


class DriverFailed(Exception):
    """No worker can be started (every attempt died before running a trial)."""


@dataclass
class Work:
    """What the trial loop runs: the space, what is left of it (in the order it goes out),
    the attempts and worker deaths earlier sessions spent on each config, the tally it
    counts into; and how: its limits, its workers (one device type each, where the run
    chooses types), a search's feed (told of each group of counted records, it returns the
    configs to queue next) and the compile limit it learns."""

    space: Space
    tally: Tally
    todo: list[int]
    spent: dict[int, int]  # index -> highest attempt spent
    deaths: dict[int, int]  # index -> worker deaths while it ran
    limits: Limits
    workers: int
    kinds: Sequence[str] = ()
    compile_limit: AdaptiveLimit | None = None
    feed: Callable[[list[TrialRecord]], Iterable[int]] | None = None

