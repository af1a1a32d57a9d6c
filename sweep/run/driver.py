"""The driver loop: a dynamic queue feeding workers, faults handled per trial.

Each worker keeps `depth` batches' worth of trials in flight (from when it is up; one that
announces its trials, from its start), dealt from the queue like cards; as records arrive
(events from a Runtime, see sweep/engines/runtime.py) they are committed to the run's log
in one durable write per COMMIT_EVERY_S (sweep/run/group_commit.py) and only then counted.
Because records stream, the driver knows which trial each worker is running and since
when, so:
- a trial past its timeout is recorded `timeout`, its worker killed and replaced; a worker
  that makes no progress between batches, or waits on its compiles past the compile limit,
  is replaced without blaming a trial;
- a worker that dies is blamed on the trial it was running, at first only as a suspicion
  (sweep/run/blame.py): the suspect runs again alone, on a worker with nothing else queued
  ("probation"), until its deaths make it `crashed`. A worker that dies before it was up
  blames nobody. Every other unfinished trial goes back to the front of the queue
  unharmed.
Every deadline uses the runtime's monotonic clock, so a step of the wall clock cannot time
out trials; records carry wall-clock times.

Which trial a worker is running is its slot's to say (sweep/run/slots.py); starting,
replacing and giving up workers is the worker pool's (sweep/run/workers.py). A stop awaits
the trials running when it came, not those begun after it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from storage.records import TrialOutcome, TrialRecord
from sweep.engines.runtime import (
    BatchBegan,
    BatchDone,
    Event,
    Runtime,
    Trial,
    TrialBegan,
    TrialsDone,
    WorkerLost,
    WorkerNote,
    WorkerUp,
)
from sweep.run.blame import Blame
from sweep.run.contracts import DriverEnd, Observer, SpentAttempt, TrialLog, Work
from sweep.run.group_commit import COMMIT_EVERY_S, GroupCommit
from sweep.run.slots import HeldBatch, Slot, TimedOut
from sweep.run.workers import Drain, WorkerPool

_UNSENT: dict[str, Any] = {}  # never changed
_PHASES: dict[type, str] = {WorkerUp: "first_worker_up", BatchBegan: "first_trial_began",
                            TrialBegan: "first_trial_began", TrialsDone: "first_trial_done",
                            BatchDone: "first_batch_done", WorkerLost: "first_worker_lost"}


class Driver:
    def __init__(self, work: Work, runtime: Runtime, log: TrialLog,
                 should_stop: Callable[[], bool], on_snapshot: Callable[[], None],
                 observers: Iterable[Observer] = (),
                 on_compilers_up: Callable[[], None] = lambda: None) -> None:
        """on_compilers_up: called once, when a worker first runs a config its compile
        pool compiled (so the pool is up). The run ends when the queue is empty and
        nothing runs."""
        self.space = work.space
        self.runtime = runtime
        self.workers = work.workers
        self.limits = limits = work.limits
        self.log = log
        self.tally = work.tally
        # Configs are looked up when sent: a queued trial holds a shared empty one (at a
        # million trials, a dict each would be a hundred MB).
        spent = work.spent
        self.queue: deque[Trial] = deque(Trial(i, _UNSENT, spent.get(i, 0) + 1)
                                         for i in work.todo)
        self.spent = spent
        self.feed = work.feed
        self.blame = Blame(work.deaths, limits.max_retries)
        self.should_stop = should_stop
        self.on_snapshot = on_snapshot
        self.observers = list(observers)
        self.compile_limit = compile_limit = work.compile_limit
        self._pushed_limit = compile_limit.current.seconds if compile_limit else None
        self.on_compilers_up: Callable[[], None] | None = on_compilers_up
        self.pool = WorkerPool(runtime, limits, work.kinds, self._event, self._requeue,
                               self._handle)
        self.dispatched = 0
        self.first_dispatch_at: float | None = None  # wall clock
        # First and all workers up, first trial begun and done, last trial done (wall clock).
        self.timeline: dict[str, float] = {}
        self._hinted: set[int] = set()
        self.commits = GroupCommit()
        self._committed = 0.0  # when _commit last ran (monotonic)

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> DriverEnd:
        if not self.queue:
            return "complete"
        # A search queues its batches as outcomes come in: every worker has work soon.
        wanted = self.workers if self.feed else min(self.workers, max(1, len(self.queue)))
        self.pool.open(wanted)
        last_snapshot = self.runtime.monotonic()
        drain: Drain | None = None  # what a stop awaits, once one came
        try:
            while True:
                if drain is None and self.should_stop():
                    drain = self.pool.stop()
                    self._event(f"draining in-flight trials for up to {self.limits.drain_s:g} s")
                if drain is None:
                    self._dispatch()
                if self._finished(drain):
                    break
                # With a write in flight, look for events without waiting for any: if none
                # came, the write is awaited (below) rather than left uncounted.
                events = self.runtime.poll(
                    0.0 if self.commits.writing is not None else self._wait_budget(drain))
                for event in events:
                    self._handle(event)
                self._check_timeouts()
                if drain is None:
                    self.pool.check_starts()
                # While records stream in, a write per COMMIT_EVERY_S, overlapping the loop;
                # as soon as they pause, at once and awaited.
                if not events:
                    self._commit(final=True)
                elif self.runtime.monotonic() - self._committed >= COMMIT_EVERY_S:
                    self._commit()
                if self.runtime.monotonic() - last_snapshot >= self.limits.snapshot_every_s:
                    self.on_snapshot()
                    last_snapshot = self.runtime.monotonic()
        except BaseException:
            self.close(cancelled=True)
            raise
        if drain is not None:
            self.close(cancelled=True)
            return "stopped"
        self._commit(final=True)
        return "budget" if self.queue else "complete"

    def _finished(self, drain: Drain | None) -> bool:
        if drain is not None:
            return drain.over(self.pool.slots, self.limits.announced, self.runtime.monotonic())
        # A batch whose every record arrived counts as done even if its stream never ended
        # (a worker frozen right after its last record): close() stops that worker.
        if any(b.pending for s in self.pool.slots for b in s.batches):
            return False
        # A feed queues more as records are counted: none may wait uncounted.
        if self.feed is not None and self.commits.pending:
            return False
        return not self.queue or self._budget_left() <= 0

    def _budget_left(self) -> int | float:
        if self.limits.max_trials is None:
            return float("inf")
        return self.limits.max_trials - self.dispatched

    def _wait_budget(self, drain: Drain | None) -> float:
        now = self.runtime.monotonic()
        deadlines = [now + 0.25]
        for slot in self.pool.slots:
            if slot.up and slot.head() is not None:
                deadlines.append(slot.since + slot.allowance(self.limits))
            elif not slot.up:
                deadlines.append(slot.born + self.limits.start_timeout_s)
        if drain is not None:
            deadlines.append(drain.until)
        return max(min(deadlines) - now, 0.0)

    # --- handing out work ----------------------------------------------------------------
    def _dispatch(self) -> None:
        while self.queue:
            takers = []
            for slot in self.pool.slots:
                # A worker that announces its trials gets work while it starts: its compile
                # pool begins on it at once, and a death before any trial began blames none.
                if not (slot.up or self.limits.announced) or not slot.has_room(self.limits) \
                        or slot.on_probation:
                    continue
                if self.queue[0][0] in self.blame.suspects:
                    if not slot.batches and self._budget_left() > 0:  # alone, on an idle one
                        self._submit(slot, [self.queue.popleft()], probation=True)
                    if not self.queue:
                        return
                    continue  # otherwise a suspect waits for an idle worker
                takers.append(slot)
            if not takers or self.queue[0][0] in self.blame.suspects or not self._deal(takers):
                return

    def _deal(self, takers: list[Slot]) -> int:
        """A batch for each taker, dealt from the queue like cards: the queue's head holds
        the slowest compiles (see scheduling.py), which go to every worker's compile pool
        alike rather than all to one. Returns how many trials went out."""
        # Shrink batches as the queue drains, so every worker has work to the end.
        share = -(-len(self.queue) // (len(self.pool.slots) * self.limits.depth))
        room = int(min(self.limits.batch_size, share))
        budget = self._budget_left()
        hands: list[list[Trial]] = [[] for _ in takers]
        dealt = 0
        while dealt < budget and self.queue and self.queue[0][0] not in self.blame.suspects:
            hand = hands[dealt % len(takers)]
            if len(hand) >= room:
                break
            hand.append(self.queue.popleft())
            dealt += 1
        for slot, hand in zip(takers, hands):
            if hand:
                self._submit(slot, hand)
        return dealt

    def _submit(self, slot: Slot, trials: list[Trial], probation: bool = False) -> None:
        configs = self.space.configs([i for i, _, _ in trials])
        trials = [Trial(i, config, attempt) for (i, _, attempt), config in zip(trials, configs)]
        if slot.head() is None:  # an idle worker: this batch is due now
            slot.since = self.runtime.monotonic()
        self.dispatched += len(trials)
        self.first_dispatch_at = self.first_dispatch_at or self.runtime.time()
        self.runtime.submit(slot.name, slot.sent, trials, self._ahead(),
                            self.compile_limit.current if self.compile_limit else None)
        slot.batches.append(HeldBatch(slot.sent, list(trials), probation, self.runtime.monotonic()))
        slot.sent += 1

    def _ahead(self) -> list[tuple[int, dict[str, Any]]]:
        """Configs in the next stretch of the queue not yet hinted to any worker, for its
        compile pool to work on when idle (see actors/compile_pool.py). Each config is
        hinted once, so two pools rarely compile the same one."""
        ahead: list[tuple[int, dict[str, Any]]] = []
        for index, _, _ in itertools.islice(self.queue, self.limits.hint_span):
            if index not in self._hinted:
                self._hinted.add(index)
                ahead.append((index, self.space.config(index)))
        return ahead

    # --- what workers report -------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        slot = self.pool.find(event.worker)
        if slot is None:
            return  # a worker already given up
        if isinstance(event, WorkerNote):
            self._event(f"worker {event.worker}: {event.text}")
            return
        now = self.runtime.monotonic()
        phase = _PHASES[type(event)]
        if phase not in self.timeline:
            self.timeline[phase] = self.runtime.time()
        if isinstance(event, WorkerUp):
            if self.pool.up(slot, event):
                self.timeline.setdefault("all_workers_up", self.runtime.time())
        elif isinstance(event, BatchBegan):
            batch = slot.batch(event.batch)
            if batch is not None:
                batch.started, slot.since = True, now
        elif isinstance(event, TrialBegan):
            batch = slot.batch(event.batch)
            if batch is not None and event.ordinal > slot.began:
                batch.started, slot.since = True, now
                slot.running, slot.began = event.index, event.ordinal
            if event.ahead and self.on_compilers_up is not None:
                self.on_compilers_up()  # may teach the compile limit (the early pool's)
                self.on_compilers_up = None
                if self.compile_limit is not None:
                    self._push_limit()
        elif isinstance(event, TrialsDone):
            batch = slot.batch(event.batch)
            done = batch.take(event.records) if batch is not None else set()
            if not done:
                return
            for record, line in zip(event.records, event.lines):
                if record.index in done:
                    self.commits.add(record, line)
            if slot.running in done:
                slot.running = None
            slot.since, slot.failed_starts = now, 0
            self.blame.finished(done)
        elif isinstance(event, BatchDone):
            slot.batches = deque(b for b in slot.batches if b.number != event.batch)
        elif isinstance(event, WorkerLost):
            self._worker_lost(slot, event)

    def _worker_lost(self, slot: Slot, event: WorkerLost) -> None:
        if self.pool.lost_while_starting(slot, event):
            return
        rest = slot.unfinished()
        current = slot.current(self.limits.announced) or slot.guess(self.limits.announced)
        if current is not None:
            batch, (index, config, attempt) = current
            rest = [t for t in rest if t[0] != index]
            confirmed = batch.probation
            crashed = self.blame.died(index, confirmed)
            self.commits.attempts.append(SpentAttempt(index, attempt, "died", event.why))
            self._event(f"worker {slot.name} died running trial {index} (attempt {attempt}"
                        f"{', alone' if confirmed else ''}): {event.why}")
            if crashed:
                # Recorded before the slot gets its next worker: the row names this one.
                self._record_failure(slot, index, config, attempt, TrialOutcome(
                    "crashed", "skipped", error=f"its worker died: {event.why}"))
            else:
                rest.insert(0, Trial(index, config, attempt + 1))
        self.pool.replace(slot)
        self._requeue(rest)

    def _check_timeouts(self) -> None:
        """End the worker of each overdue slot (slots.py's verdict says why), once what it
        sent has been taken: a trial that timed out is recorded, the rest go back."""
        for slot in list(self.pool.slots):
            if not slot.overdue(self.limits, self.runtime.monotonic()):
                continue
            for event in self.runtime.settle(slot.name, 0.0):  # take what already arrived
                self._handle(event)
            verdict = slot.verdict(self.limits, self.runtime.monotonic()) \
                if slot in self.pool.slots else None
            if verdict is None:
                continue
            self._event(verdict.why)
            rest = slot.unfinished()
            if isinstance(verdict, TimedOut):
                index, config, attempt = verdict.trial
                self._record_failure(slot, index, config, attempt, TrialOutcome(
                    "timeout", "skipped", error=verdict.error))
                rest = [t for t in rest if t[0] != index]
            self.pool.replace(slot)
            self._requeue(rest)

    def _record_failure(self, slot: Slot, index: int, config: dict[str, Any], attempt: int,
                        outcome: TrialOutcome) -> None:
        self.commits.add(slot.record(index, self.space.kernel_config(index), attempt, outcome,
                                     self.runtime.time(), self.runtime.monotonic()))

    def _requeue(self, trials: list[Trial]) -> None:
        self.dispatched -= len(trials)
        self.queue.extendleft(reversed(trials))

    def _commit(self, final: bool = False) -> None:
        """Group commit (see group_commit.py): the trials of each group count once it is
        durable; with final, everything is written and counted before this returns."""
        self._committed = self.runtime.monotonic()
        for records in self.commits.commit(self.log, final):
            self._count(records)

    def _count(self, records: list[TrialRecord]) -> None:
        if not records:
            return
        self.timeline["last_trial_done"] = self.runtime.time()
        if self.compile_limit is not None:
            self.compile_limit.observe(records)
            self._push_limit()
        self.tally.add(records)
        if self.feed is not None:
            self.queue.extend(Trial(i, _UNSENT, self.spent.get(i, 0) + 1)
                              for i in self.feed(records))
        try:
            for observer in self.observers:
                observer.on_records(records, self.tally)
        except BaseException:
            # A KeyboardInterrupt (an API caller's second Ctrl+C) from inside an observer:
            # the rest of this group goes unobserved, so no later group may be observed.
            self.observers = []
            raise

    def _push_limit(self) -> None:
        """A compile limit learnt now reaches the workers now: compiles already running
        past it stop, not when the next batch brings it (a search sends none while it
        waits on them)."""
        assert self.compile_limit is not None
        if self.compile_limit.current.seconds == self._pushed_limit:
            return
        self._pushed_limit = self.compile_limit.current.seconds
        for slot in self.pool.slots:
            if slot.up:
                self.runtime.set_limit(slot.name, self.compile_limit.current)

    def _event(self, message: str) -> None:
        for observer in self.observers:
            observer.on_event(message)

    def close(self, cancelled: bool = False) -> None:
        """Stop every worker; trials still running spend an attempt and run again later."""
        for slot in list(self.pool.slots) if cancelled else ():
            # Take what already arrived first: records are real results, and a batch the
            # worker began counts its running trial as an attempt spent.
            for event in self.runtime.settle(slot.name, 0.0):
                self._handle(event)
            if slot not in self.pool.slots:
                continue  # its worker died meanwhile, its trials dealt with as a death's
            current = slot.current(self.limits.announced)
            if current is not None and current[0].started:
                index, _, attempt = current[1]
                self.commits.attempts.append(SpentAttempt(index, attempt, "interrupted"))
        self.pool.end()
        self._commit(final=True)
        self.commits.close()
