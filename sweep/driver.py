"""The driver loop: a dynamic queue feeding Ray actors, faults handled per trial.

Each worker keeps `depth` batches in flight; as records stream back (ray.wait over the
workers' generators) they are appended to the journal in one fsync'd write per loop turn
and only then counted. Because records stream, the driver knows which trial each worker is
running and since when, so:
- a trial past its timeout is recorded `timeout`, its worker killed and replaced;
- a worker that dies is blamed on the first trial it had not reported. Messages sent just
  before a process dies can be lost, so that blame is only a suspicion: the suspect runs
  again alone on a fresh worker ("probation"), where a death is certainly its own. A trial
  whose worker died more than max_retries times, the last on probation, is `crashed`.
  Every other unfinished trial goes back to the front of the queue unharmed.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from actors.timing import Timing
from actors.worker import BatchStarted, TrialWorker, WorkerSettings
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
    compile_workers: int = 0  # compile processes per worker (cuda)


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


@dataclass
class _Batch:
    trials: list[Trial]
    gen: Any  # ray ObjectRefGenerator
    probation: bool = False  # a lone suspect: a death now is certainly its own
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
    sent: int = 0  # batches sent to this actor; the worker runs them in this order
    ready: Any = None  # its info() call, answered once the worker is up
    born: float = field(default_factory=time.monotonic)
    up: bool = False

    @property
    def on_probation(self) -> bool:
        return any(b.probation for b in self.batches)


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
        # A trial whose worker died (possibly in an earlier session) runs alone next time.
        self.probation: set[int] = set(deaths)
        self.should_stop = should_stop
        self.on_snapshot = on_snapshot
        self.observers = list(observers)
        self.slots: list[_Slot] = []
        self.dispatched = 0
        self.first_dispatch_at: float | None = None
        self._serial = 0
        self._hinted: set[int] = set()
        self._pending_records: list[TrialRecord] = []
        self._pending_attempts: list[bytes] = []

    # --- workers -------------------------------------------------------------------------
    def _new_actor(self, name: str) -> Any:
        p = self.placement
        # A thread for each batch queued on the worker (see actors/worker.py), and one for
        # info() and retime().
        options: dict[str, Any] = {"num_cpus": p.num_cpus, "num_gpus": p.num_gpus,
                                   "max_restarts": 0, "max_task_retries": 0,
                                   "max_concurrency": self.limits.depth + 1}
        if p.env:
            options["runtime_env"] = {"env_vars": p.env}
        return ray.remote(TrialWorker).options(**options).remote(self.settings, name)

    def _next_name(self) -> str:
        self._serial += 1
        return f"w{self._serial}"

    def _new_slot(self) -> _Slot:
        slot = _Slot("", None)
        self._start_actor(slot)
        return slot

    def _start_actor(self, slot: _Slot) -> None:
        """A new actor in the slot; what the slot learnt of failures so far stays."""
        slot.name = self._next_name()
        slot.actor = self._new_actor(slot.name)
        slot.ready, slot.born, slot.up = slot.actor.info.remote(), time.monotonic(), False
        slot.batches.clear()
        slot.sent = 0

    def _replace(self, slot: _Slot) -> None:
        with contextlib.suppress(RayError):
            ray.kill(slot.actor, no_restart=True)
        self._start_actor(slot)

    def _check_starts(self) -> None:
        """A worker that is not up within start_timeout_s is given up: Ray may be unable
        to place it (a lost node, a cluster whose GPUs other jobs hold). Its trials go
        back to the queue; the sweep goes on with the workers it has."""
        for slot in list(self.slots):
            if slot.up:
                continue
            if ray.wait([slot.ready], timeout=0)[0]:
                slot.up = True  # a failed start surfaces as a death on its first batch
                continue
            if time.monotonic() - slot.born < self.limits.start_timeout_s:
                continue
            with contextlib.suppress(RayError):
                ray.kill(slot.actor, no_restart=True)
            self.slots.remove(slot)
            self._requeue([t for b in slot.batches for t in b.unfinished()])
            if not self.slots:
                raise DriverFailed(f"no worker started within run.start_timeout_s="
                                   f"{self.limits.start_timeout_s:g} s; does the Ray cluster "
                                   "have the free GPUs (or CPUs) it advertises?")
            self._event(f"worker {slot.name} did not start within "
                        f"{self.limits.start_timeout_s:g} s (no free resources for it?); "
                        f"going on with {len(self.slots)}")

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> Ending:
        if not self.queue:
            return "complete"
        workers = min(self.placement.workers, max(1, len(self.queue)))
        self.slots = [self._new_slot() for _ in range(workers)]
        # Hand out work once workers are up (GPU context, compile pool), so a trial's clock
        # and the sweep's first dispatch start with real work; a worker that fails to
        # start shows up as a death on its first batch, one that cannot be placed is
        # given up after start_timeout_s.
        pending = [s.ready for s in self.slots]
        deadline = time.monotonic() + self.limits.start_timeout_s
        while pending and not self.should_stop() and time.monotonic() < deadline:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
        last_snapshot = time.monotonic()
        stopping_at: float | None = None
        try:
            while True:
                if stopping_at is None and self.should_stop():
                    stopping_at = time.monotonic() + self.limits.drain_s
                    self._event(f"draining in-flight trials for up to {self.limits.drain_s:g} s")
                if stopping_at is None:
                    self._dispatch()
                # Once stopping, batches a worker has not begun are abandoned, not awaited:
                # their trials were never acknowledged and run again on resume.
                gens = [b.gen for s in self.slots for b in s.batches
                        if stopping_at is None or b.started]
                if not gens:
                    break
                if stopping_at is not None and time.monotonic() >= stopping_at:
                    break
                self._collect(gens, wait_s=self._wait_budget(stopping_at))
                self._check_timeouts()
                if stopping_at is None:
                    self._check_starts()
                self._commit()
                if time.monotonic() - last_snapshot >= self.limits.snapshot_every_s:
                    self.on_snapshot()
                    last_snapshot = time.monotonic()
        except BaseException:
            self.close(cancelled=True)
            raise
        if stopping_at is not None:
            self.close(cancelled=True)
            return "stopped"
        self._commit()
        return "budget" if self.queue else "complete"

    def retime(self, configs: list[dict[str, Any]], rounds: int) -> list[Timing]:
        """Re-time finalists interleaved on one worker, so they share one device's
        conditions. Call after a complete run, before close()."""
        if not self.slots:  # a resumed run whose trials were all done before
            self.slots.append(self._new_slot())  # close() stops it
        slot = self.slots[0]
        return ray.get(slot.actor.retime.remote(configs, rounds))

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
        for slot in self.slots:
            while self.queue and len(slot.batches) < self.limits.depth \
                    and not slot.on_probation:
                if self.queue[0][0] in self.probation:
                    if slot.batches:
                        break  # a suspect waits for an idle worker
                    self._submit(slot, [self.queue.popleft()], probation=True)
                    break
                # Shrink batches as the queue drains, so every worker has work to the end.
                share = -(-len(self.queue) // (len(self.slots) * self.limits.depth))
                room = min(self.limits.batch_size, share)
                if self.limits.max_trials is not None:
                    room = min(room, self.limits.max_trials - self.dispatched)
                    if room <= 0:
                        return
                trials: list[Trial] = []
                while self.queue and len(trials) < room \
                        and self.queue[0][0] not in self.probation:
                    trials.append(self.queue.popleft())
                self._submit(slot, trials)

    def _submit(self, slot: _Slot, trials: list[Trial], probation: bool = False) -> None:
        trials = [(i, self.space.config(i), attempt) for i, _, attempt in trials]
        self.dispatched += len(trials)
        self.first_dispatch_at = self.first_dispatch_at or time.time()
        gen = slot.actor.run.remote(slot.sent, trials, self._ahead())
        slot.sent += 1
        slot.batches.append(_Batch(trials, gen, probation=probation, since=time.time()))

    def _ahead(self) -> list[tuple[int, dict[str, Any]]]:
        """Configs in the next stretch of the queue not yet hinted to any worker, for its
        compile pool to work on when idle (see actors/compile_pool.py). The stretch is four
        pools' worth: on an H200 a slow compile (6 s) outlasts a hundred trials. Each config
        is hinted once, so two pools rarely compile the same one."""
        ahead: list[tuple[int, dict[str, Any]]] = []
        for index, _, _ in itertools.islice(self.queue, 4 * self.placement.compile_workers):
            if index not in self._hinted:
                self._hinted.add(index)
                ahead.append((index, self.space.config(index)))
        return ahead

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
            if batch.unfinished():  # the stream ended early: the worker is gone
                self._worker_died(slot, "worker ended its batch early")
            else:
                slot.batches.remove(batch)
            return
        try:
            message = ray.get(ref)
        except RayActorError as e:
            self._worker_died(slot, f"worker died: {e}", init_failed=e.actor_init_failed)
            return
        except RayError as e:  # an exception escaped the worker's loop: treat as a death
            self._worker_died(slot, f"worker failed: {e}")
            return
        self._deliver(slot, batch, message)

    def _deliver(self, slot: _Slot, batch: _Batch, message: Any) -> None:
        now = time.time()
        if isinstance(message, BatchStarted):
            batch.started, batch.since, slot.up = True, now, True
        elif isinstance(message, TrialRecord):
            self.probation.discard(message.index)
            batch.done += 1
            batch.since = now
            slot.device, slot.node, slot.failed_starts = message.device, message.node, 0
            self._pending_records.append(message)

    def _running_batch(self, slot: _Slot) -> _Batch | None:
        for batch in slot.batches:
            if batch.done < len(batch.trials):
                return batch if batch.started else None
        return None

    def _drain_available(self, slot: _Slot, wait_s: float) -> None:
        """Take every message a worker produced before we give up on it. A dead worker's
        streams end in an error soon, so waiting a little finds where it really stopped;
        a hung one's never end, so there we take only what has arrived."""
        deadline = time.monotonic() + wait_s
        for batch in list(slot.batches):
            while batch in slot.batches:
                left = max(0.0, deadline - time.monotonic())
                ready, _ = ray.wait([batch.gen], timeout=left)
                if not ready:
                    break
                try:
                    message = ray.get(next(batch.gen), timeout=5)
                except StopIteration:
                    break  # its unfinished trials, if any, are still the slot's to requeue
                except (RayError, GetTimeoutError):
                    return
                self._deliver(slot, batch, message)

    def _worker_died(self, slot: _Slot, why: str, init_failed: bool = False) -> None:
        self._drain_available(slot, wait_s=5.0)
        rest = [t for b in slot.batches for t in b.unfinished()]
        confirmed = slot.on_probation
        since = next((b.since for b in slot.batches if b.unfinished()), time.time())
        self._replace(slot)
        if init_failed:
            slot.failed_starts += 1
            if slot.failed_starts >= 3:
                raise DriverFailed(f"a worker failed to start 3 times: {why[:1000]}")
            self._event(f"a worker failed to start; replacing it: {why[:200]}")
            self._requeue(rest)
            return
        if not rest:
            return
        index, config, attempt = rest[0]
        self.deaths[index] = self.deaths.get(index, 0) + 1
        self._pending_attempts.append(encode_attempt(index, attempt, "died"))
        self._event(f"worker died running trial {index} (attempt {attempt}"
                    f"{', alone' if confirmed else ''})")
        if confirmed and self.deaths[index] > self.limits.max_retries:
            self.probation.discard(index)
            self._record_failure(slot, index, config, attempt, since, TrialOutcome(
                "crashed", "skipped", error=why))
            rest = rest[1:]
        else:
            self.probation.add(index)
            rest[0] = (index, config, attempt + 1)
        self._requeue(rest)

    def _check_timeouts(self) -> None:
        now = time.time()
        for slot in self.slots:
            running = self._running_batch(slot)
            if running is None or now - running.since < self.limits.trial_timeout_s:
                continue
            self._drain_available(slot, wait_s=0.0)
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

    def close(self, cancelled: bool = False) -> None:
        """Stop every worker; trials still running spend an attempt and run again later."""
        for slot in self.slots:
            if cancelled:
                # Take what already arrived first: records are real results, and a batch
                # the worker began counts its running trial as an attempt spent.
                with contextlib.suppress(RayError):
                    self._drain_available(slot, wait_s=0.0)
                running = self._running_batch(slot)
                if running is not None:
                    index, _, attempt = running.unfinished()[0]
                    self._pending_attempts.append(encode_attempt(index, attempt, "interrupted"))
            with contextlib.suppress(RayError):
                ray.kill(slot.actor, no_restart=True)
        self.slots = []
        self._commit()
