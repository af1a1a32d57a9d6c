"""The run's workers, one slot each (sweep/run/slots.py): started, replaced, given up,
and what they say of themselves (up, on which device, with which versions; lost while
starting, which blames no trial).

The trial loop (sweep/run/driver.py) owns the trials and the blame; this owns the
places. The two meet at two callbacks the loop passes in: where a given-up slot's
unfinished trials go back to, and where a worker's events go while the loop is not
running (a worker started for re-timing, see sweep/run/retiming.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sweep.engines.runtime import Event, Runtime, Trial, WorkerLost, WorkerUp
from sweep.run.contracts import DriverFailed, Limits
from sweep.run.slots import Slot


@dataclass(frozen=True)
class Drain:
    """A stop's wait: for what its workers were running when it came, until `until` (the
    runtime's monotonic clock)."""

    awaited: frozenset[tuple[str, int | None]]  # (worker, trial) or (worker, batch)
    until: float

    def over(self, slots: Sequence[Slot], announced: bool, now: float) -> bool:
        """Whether nothing awaited still runs, or the time is up. Batches a worker has not
        begun are abandoned, not awaited: their trials were never acknowledged and run
        again on resume."""
        if announced:
            running = any(s.running is not None and (s.name, s.running) in self.awaited
                          for s in slots)
        else:
            running = any(b.started and b.pending and (s.name, b.number) in self.awaited
                          for s in slots for b in s.batches)
        return not running or now >= self.until


class WorkerPool:
    def __init__(self, runtime: Runtime, limits: Limits, kinds: Sequence[str],
                 tell: Callable[[str], None], requeue: Callable[[list[Trial]], None],
                 handle: Callable[[Event], None]) -> None:
        """kinds: the device type each worker asks for (Placement.kinds; empty: any).
        tell: says a line to the user; requeue: takes a given-up slot's unfinished
        trials back; handle: the loop's handling of a worker's event."""
        self.runtime = runtime
        self.limits = limits
        self.kinds = list(kinds)
        self.tell = tell
        self.requeue = requeue
        self.handle = handle
        self.slots: list[Slot] = []
        # Each device type's torch and Triton versions, as its workers report them.
        self.versions: dict[str, dict[str, str]] = {}
        self.kind_of: dict[str, str] = {}  # device name -> the kind that gave it
        self._stopping = False  # a run that is ending starts no workers
        self._serial = 0

    def open(self, wanted: int) -> None:
        for k in range(wanted):
            slot = Slot(kind=self.kinds[k] if self.kinds else "")
            self.slots.append(slot)
            self.start(slot)

    def stop(self) -> Drain:
        """Start no more workers (a run that is ending); what the stop awaits, for up to
        run.drain_s: the trials announced running, or (workers running in order) the
        batches begun. What a worker begins after this is not awaited."""
        self._stopping = True
        if self.limits.announced:
            awaited = {(s.name, s.running) for s in self.slots}
        else:
            awaited = {(s.name, b.number) for s in self.slots for b in s.batches if b.started}
        return Drain(frozenset(awaited), self.runtime.monotonic() + self.limits.drain_s)

    def end(self) -> None:
        """Every worker killed: the run's end."""
        for slot in self.slots:
            self.runtime.kill(slot.name)
        self.slots = []

    def find(self, worker: str) -> Slot | None:
        return next((s for s in self.slots if s.name == worker), None)

    def start(self, slot: Slot) -> None:
        """A new worker in the slot; what the slot learnt of failures so far stays."""
        self._serial += 1
        slot.name = f"w{self._serial}"
        slot.batches.clear()
        slot.up, slot.sent, slot.running, slot.began = False, 0, None, -1
        slot.born = self.runtime.monotonic()
        self.runtime.start(slot.name, slot.kind)

    def replace(self, slot: Slot) -> None:
        self.runtime.kill(slot.name)
        if self._stopping:
            self.slots.remove(slot)
        else:
            self.start(slot)

    def give_up(self, slot: Slot, why: str) -> None:
        """Go on without this slot; with none left, the run has failed."""
        self.runtime.kill(slot.name)
        self.slots.remove(slot)
        self.requeue(slot.unfinished())
        if not self.slots:
            raise DriverFailed(why)
        self.tell(f"{why}; going on with {len(self.slots)} worker(s)")

    def up(self, slot: Slot, event: WorkerUp) -> bool:
        """The slot's worker is up; whether every slot's is."""
        slot.up, slot.device, slot.node = True, event.device, event.node
        slot.since = self.runtime.monotonic()
        self.kind_of[event.device] = slot.kind
        if event.versions:
            self.versions[event.device] = dict(event.versions)
        return all(s.up for s in self.slots)

    def lost_while_starting(self, slot: Slot, event: WorkerLost) -> bool:
        """A worker that died before it could run anything (a killed or failing start-up):
        no trial is to blame, and it is replaced, but a slot whose workers keep dying so
        is given up. Whether it was so (else the trial loop's blame is due)."""
        began = slot.running is not None or any(b.started for b in slot.batches)
        if not event.init_failed and (slot.up or began):
            return False
        slot.failed_starts += 1
        if slot.failed_starts >= self.limits.max_failed_starts:
            self.give_up(slot, f"a worker failed to start {slot.failed_starts} times "
                               f"(the last, {slot.name}: {event.why})")
            return True
        self.tell(f"worker {slot.name} died while starting: {event.why}; starting another")
        rest = slot.unfinished()
        self.replace(slot)
        self.requeue(rest)
        return True

    def check_starts(self) -> None:
        """A worker that is not up within start_timeout_s is given up: Ray may be unable
        to place it (a lost node, a cluster whose GPUs other jobs hold). The sweep goes on
        with the workers it has."""
        now = self.runtime.monotonic()
        for slot in list(self.slots):
            if slot.up or now - slot.born < self.limits.start_timeout_s:
                continue
            if len(self.slots) == 1:
                self.give_up(slot, f"no worker started within run.start_timeout_s="
                                   f"{self.limits.start_timeout_s:g} s; does the Ray cluster "
                                   "have the free GPUs (or CPUs) it advertises?")
            self.give_up(slot, f"worker {slot.name} did not start within run.start_timeout_s="
                               f"{self.limits.start_timeout_s:g} s (no free resources for it?)")

    def worker_on(self, device: str | None) -> Slot:
        """A worker that is up (on the device type, if given); started if there is none
        (a resumed run whose trials were all done before, a type whose workers died)."""
        def fits(s: Slot) -> bool:
            return s.up and device in (None, s.device)

        slot = next((s for s in self.slots if fits(s)), None)
        if slot is not None:
            return slot
        known = self.kind_of.get(device or "")
        for kind in [known] if known is not None else dict.fromkeys(self.kinds or [""]):
            slot = self._await_worker(kind)
            if fits(slot):
                return slot
        raise DriverFailed(f"no worker on a {device} came up for re-timing")

    def _await_worker(self, kind: str) -> Slot:
        slot = Slot(kind=kind)
        self.slots.append(slot)  # close() stops it
        self.start(slot)
        while not slot.up:
            if self.runtime.monotonic() - slot.born >= self.limits.start_timeout_s:
                raise DriverFailed("no worker started for re-timing within "
                                   f"run.start_timeout_s={self.limits.start_timeout_s:g} s")
            for event in self.runtime.poll(0.25):
                self.handle(event)
            if slot not in self.slots:
                raise DriverFailed("the worker started for re-timing died")
        return slot
