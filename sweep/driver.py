"""The driver loop: a dynamic queue feeding Ray actors, faults handled per trial.

Each worker keeps `depth` batches in flight; as records stream back (ray.wait over the
workers' generators) they are appended to the journal in one fsync'd write per loop turn
and only then counted. Because records stream, the driver knows which trial each worker is
running and since when, so:
- a trial past its timeout is recorded `timeout`, its worker killed and replaced;
- a worker that dies is blamed on the trial it was running, which is re-run on a fresh
  worker up to max_retries times and then recorded `crashed`; its other trials go back
  to the front of the queue unharmed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from actors.worker import BatchStarted, Retire, TrialWorker, WorkerSettings
from storage.journal import Journal, append_records, encode_attempt
from storage.records import TrialOutcome, TrialRecord
from sweep.space import Space
from sweep.tally import Tally

Trial = tuple[int, dict[str, Any], int]  # index, config, attempt
Ending = Literal["complete", "stopped", "budget"]


class Observer(Protocol):
    """A narrow hook for progress displays and the like; called on the driver's thread."""

    def on_records(self, records: list[TrialRecord], tally: Tally) -> None: ...

    def on_event(self, message: str) -> None: ...


@dataclass(frozen=True)
class Placement:
    """How many workers, and what each asks of Ray."""

    workers: int
    num_gpus: float = 0.0
    num_cpus: float = 0.0
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    trial_timeout_s: float
    max_retries: int
    drain_s: float
    snapshot_every_s: float
    batch_size: int = 1
    depth: int = 2
    max_trials: int | None = None


@dataclass
class _Batch:
    trials: list[Trial]
    gen: Any  # ray ObjectRefGenerator
    started: bool = False
    done: int = 0
    since: float = 0.0  # when the trial now running began, as the driver saw it

    def unfinished(self) -> list[Trial]:
        return self.trials[self.done:]


@dataclass
class _Slot:
    name: str
    actor: Any
    batches: deque[_Batch] = field(default_factory=deque)
    device: str = "unknown"
    node: str = "unknown"
    failed_starts: int = 0


class DriverFailed(Exception):
    """No worker can be started (every attempt died before running a trial)."""


class Driver:
    def __init__(self, space: Space, settings: WorkerSettings, placement: Placement,
                 limits: Limits, journal: Journal, attempt_log: Journal, tally: Tally,
                 todo: Iterable[int], spent: dict[int, int], deaths: dict[int, int],
                 should_stop: Callable[[], bool], on_snapshot: Callable[[], None],
                 observers: Iterable[Observer] = ()) -> None:
        self.space = space
        self.settings = settings
        self.placement = placement
        self.limits = limits
        self.journal = journal
        self.attempt_log = attempt_log
        self.tally = tally
        self.queue: deque[Trial] = deque((i, {}, spent.get(i, 0) + 1) for i in todo)
        self.deaths = dict(deaths)
        self.should_stop = should_stop
        self.on_snapshot = on_snapshot
        self.observers = list(observers)
        self.slots: list[_Slot] = []
        self.dispatched = 0
        self._serial = 0
        self._pending_records: list[TrialRecord] = []
        self._pending_attempts: list[bytes] = []

    # --- workers -------------------------------------------------------------------------
    def _new_actor(self, name: str) -> Any:
        p = self.placement
        options: dict[str, Any] = {"num_cpus": p.num_cpus, "num_gpus": p.num_gpus,
                                   "max_restarts": 0, "max_task_retries": 0}
        if p.env:
            options["runtime_env"] = {"env_vars": p.env}
        return ray.remote(TrialWorker).options(**options).remote(self.settings, name)

    def _next_name(self) -> str:
        self._serial += 1
        return f"w{self._serial}"

    def _replace(self, slot: _Slot) -> None:
        try:
            ray.kill(slot.actor, no_restart=True)
        except RayError:
            pass
        slot.batches.clear()
        slot.name = self._next_name()
        slot.actor = self._new_actor(slot.name)

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> Ending:
        workers = min(self.placement.workers, max(1, len(self.queue)))
        self.slots = [_Slot(name, self._new_actor(name))
                      for name in (self._next_name() for _ in range(workers))]
        last_snapshot = time.monotonic()
        stopping_at: float | None = None
        try:
            while True:
                if stopping_at is None and self.should_stop():
                    stopping_at = time.monotonic() + self.limits.drain_s
                    self._event(f"draining in-flight trials for up to {self.limits.drain_s:g} s")
                if stopping_at is None:
                    self._dispatch()
                gens = [b.gen for s in self.slots for b in s.batches]
                if not gens:
                    break
                if stopping_at is not None and time.monotonic() >= stopping_at:
                    break
                self._collect(gens, wait_s=self._wait_budget(stopping_at))
                self._check_timeouts()
                self._commit()
                if time.monotonic() - last_snapshot >= self.limits.snapshot_every_s:
                    self.on_snapshot()
                    last_snapshot = time.monotonic()
        finally:
            self._shutdown(cancelled=stopping_at is not None)
        if stopping_at is not None:
            return "stopped"
        return "budget" if self.queue else "complete"

    def _wait_budget(self, stopping_at: float | None) -> float:
        wait = 0.25
        now = time.monotonic()
        for slot in self.slots:
            head = self._running_batch(slot)
            if head is not None:
                wait = min(wait, head.since + self.limits.trial_timeout_s - time.time())
        if stopping_at is not None:
            wait = min(wait, stopping_at - now)
        return max(wait, 0.0)

    def _dispatch(self) -> None:
        budget = self.limits.max_trials
        for slot in self.slots:
            while self.queue and len(slot.batches) < self.limits.depth:
                room = self.limits.batch_size
                if budget is not None:
                    room = min(room, budget - self.dispatched)
                    if room <= 0:
                        return
                trials = []
                for _ in range(min(room, len(self.queue))):
                    index, _, attempt = self.queue.popleft()
                    trials.append((index, self.space.config(index), attempt))
                self.dispatched += len(trials)
                slot.batches.append(_Batch(trials, slot.actor.run.remote(trials),
                                           since=time.time()))

    def _collect(self, gens: list[Any], wait_s: float) -> None:
        ready, _ = ray.wait(gens, num_returns=1, timeout=wait_s)
        if not ready:
            return
        ready, _ = ray.wait(gens, num_returns=len(gens), timeout=0)
        ready_ids = {id(g) for g in ready}
        for slot in list(self.slots):
            for batch in list(slot.batches):
                if id(batch.gen) in ready_ids and batch in slot.batches:
                    self._take_one(slot, batch)

    def _take_one(self, slot: _Slot, batch: _Batch) -> None:
        """Consume the next message of one batch's stream."""
        try:
            ref = next(batch.gen)
        except StopIteration:
            slot.batches.remove(batch)
            self._requeue(batch.unfinished())  # only non-empty if the worker retired
            return
        try:
            message = ray.get(ref)
        except RayActorError as e:
            self._worker_died(slot, f"worker died: {e}")
            return
        except RayError as e:  # an exception escaped the worker's loop: treat as a death
            self._worker_died(slot, f"worker failed: {e}")
            return
        self._deliver(slot, batch, message)

    def _deliver(self, slot: _Slot, batch: _Batch, message: Any) -> None:
        now = time.time()
        if isinstance(message, BatchStarted):
            batch.started, batch.since = True, now
        elif isinstance(message, TrialRecord):
            batch.done += 1
            batch.since = now
            slot.device, slot.node, slot.failed_starts = message.device, message.node, 0
            self._pending_records.append(message)
        elif isinstance(message, Retire):
            self._event(f"replacing worker {slot.name}: {message.reason[:200]}")
            rest = [t for b in slot.batches for t in b.unfinished()]
            self._replace(slot)
            self._requeue(rest)

    def _running_batch(self, slot: _Slot) -> _Batch | None:
        for batch in slot.batches:
            if batch.done < len(batch.trials):
                return batch if batch.started else None
        return None

    def _drain_available(self, slot: _Slot) -> None:
        """Take every message a worker already produced before we give up on it."""
        for batch in list(slot.batches):
            while batch in slot.batches:
                ready, _ = ray.wait([batch.gen], timeout=0)
                if not ready:
                    break
                try:
                    ref = next(batch.gen)
                    message = ray.get(ref, timeout=5)
                except StopIteration:
                    slot.batches.remove(batch)
                    break
                except (RayError, GetTimeoutError):
                    return
                self._deliver(slot, batch, message)

    def _worker_died(self, slot: _Slot, why: str) -> None:
        self._drain_available(slot)
        running = self._running_batch(slot)
        rest = [t for b in slot.batches for t in b.unfinished()]
        if running is None:
            slot.failed_starts += 1
            if slot.failed_starts >= 3:
                raise DriverFailed(f"worker {slot.name} died 3 times before running a trial: "
                                   f"{why[:500]}")
            self._event(f"worker {slot.name} died before running a trial; replacing it")
            self._replace(slot)
            self._requeue(rest)
            return
        index, config, attempt = rest[0]
        self.deaths[index] = self.deaths.get(index, 0) + 1
        self._pending_attempts.append(encode_attempt(index, attempt, "died"))
        self._event(f"worker {slot.name} died running trial {index} (attempt {attempt})")
        self._replace(slot)
        if self.deaths[index] > self.limits.max_retries:
            self._record_failure(slot, index, config, attempt, running.since, TrialOutcome(
                "crashed", "skipped", error=why))
        else:
            rest[0] = (index, config, attempt + 1)
        self._requeue(rest[1:] if self.deaths[index] > self.limits.max_retries else rest)

    def _check_timeouts(self) -> None:
        now = time.time()
        for slot in self.slots:
            running = self._running_batch(slot)
            if running is None or now - running.since < self.limits.trial_timeout_s:
                continue
            self._drain_available(slot)
            running = self._running_batch(slot)
            if running is None or now - running.since < self.limits.trial_timeout_s:
                continue
            rest = [t for b in slot.batches for t in b.unfinished()]
            index, config, attempt = rest[0]
            self._event(f"trial {index} passed {self.limits.trial_timeout_s:g} s; "
                        f"replacing worker {slot.name}")
            self._record_failure(slot, index, config, attempt, running.since, TrialOutcome(
                "timeout", "skipped",
                error=f"no result within run.trial_timeout_s={self.limits.trial_timeout_s:g} s"))
            self._replace(slot)
            self._requeue(rest[1:])

    def _record_failure(self, slot: _Slot, index: int, config: dict[str, Any], attempt: int,
                        started: float, outcome: TrialOutcome) -> None:
        self._pending_records.append(TrialRecord.from_outcome(
            index, config, outcome, device=slot.device, node=slot.node, worker=slot.name,
            attempt=attempt, started_at=started, finished_at=time.time()))

    def _requeue(self, trials: list[Trial]) -> None:
        self.dispatched -= len(trials)
        self.queue.extendleft(reversed(trials))

    def _commit(self) -> None:
        """Group commit: one fsync'd append, then the trials count as done."""
        if self._pending_attempts:
            self.attempt_log.append(self._pending_attempts)
            self._pending_attempts = []
        if not self._pending_records:
            return
        records, self._pending_records = self._pending_records, []
        append_records(self.journal, records)
        self.tally.add(records)
        for observer in self.observers:
            observer.on_records(records, self.tally)

    def _event(self, message: str) -> None:
        for observer in self.observers:
            observer.on_event(message)

    def _shutdown(self, cancelled: bool) -> None:
        """Stop every worker; trials still running spend an attempt and run again later."""
        for slot in self.slots:
            if cancelled:
                running = self._running_batch(slot)
                if running is not None:
                    index, _, attempt = running.unfinished()[0]
                    self._pending_attempts.append(encode_attempt(index, attempt, "interrupted"))
            try:
                ray.kill(slot.actor, no_restart=True)
            except RayError:
                pass
        self._commit()
