"""Re-timing once a sweep's trials are done: finalists side by side on one worker of a
device type, so they share one device's conditions, and a successive-halving rung spread
over every worker of it at once. Part of the driver (its workers and events), kept apart
because it runs after the loop, not in it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from actors.protocol import Retimed, Timing
from sweep.engines.runtime import Event, Runtime
from sweep.run.contracts import DriverFailed, Limits
from sweep.run.slots import Slot


class Retiming:
    """The driver's re-timing, as a part of the Driver class (which derives from it): the
    attributes and the two methods declared here are the driver's, its workers and the
    handling of their events."""

    runtime: Runtime
    limits: Limits
    slots: list[Slot]
    kinds: Sequence[str]
    _kind_of: dict[str, str]  # device name -> the kind that gave it
    should_stop: Callable[[], bool]

    def _start(self, slot: Slot) -> None:
        raise NotImplementedError

    def _handle(self, event: Event) -> None:
        raise NotImplementedError

    def retime(self, configs: list[dict[str, Any]], rounds: int,
               device: str | None = None) -> Retimed:
        """Re-time finalists interleaved on one worker, so they share one device's
        conditions: one of the given device type, if any; with them the kernel's torch
        baseline, where the backend runs one. Call after a complete run, before close()."""
        slot = self._worker_on(device)
        # Each round times every finalist once: about one trial's worth of work.
        return self.runtime.retime(slot.name, configs, rounds,
                                   rounds * self.limits.trial_timeout_s, self.should_stop)

    def retime_spread(self, configs: list[dict[str, Any]], device: str) -> list[Timing]:
        """Time each config once more with the careful timing, spread over every worker
        up on the device type at once (a successive-halving rung, see sweep/search/strategies.py);
        the timings in the configs' order."""
        slots = [s for s in self.slots if s.up and s.device == device] or \
            [self._worker_on(device)]
        shares = [configs[k::len(slots)] for k in range(len(slots))]
        with ThreadPoolExecutor(len(slots), thread_name_prefix="rung") as pool:
            results = list(pool.map(
                lambda slot, share: self.runtime.retime(
                    slot.name, share, 1, max(1, len(share)) * self.limits.trial_timeout_s,
                    self.should_stop) if share else Retimed([]), slots, shares))
        out: list[Timing] = [Timing(float("inf"), float("inf"), float("inf"))] * len(configs)
        for k, retimed in enumerate(results):
            for j, timing in enumerate(retimed.finalists):
                out[k + j * len(slots)] = timing
        return out

    def _worker_on(self, device: str | None) -> Slot:
        """A worker that is up (on the device type, if given); started if there is none
        (a resumed run whose trials were all done before, a type whose workers died)."""
        def fits(s: Slot) -> bool:
            return s.up and device in (None, s.device)

        slot = next((s for s in self.slots if fits(s)), None)
        if slot is not None:
            return slot
        known = self._kind_of.get(device or "")
        for kind in [known] if known is not None else dict.fromkeys(self.kinds or [""]):
            slot = self._await_worker(kind)
            if fits(slot):
                return slot
        raise DriverFailed(f"no worker on a {device} came up for re-timing")

    def _await_worker(self, kind: str = "") -> Slot:
        slot = Slot(kind=kind)
        self.slots.append(slot)  # close() stops it
        self._start(slot)
        while not slot.up:
            if self.runtime.monotonic() - slot.born >= self.limits.start_timeout_s:
                raise DriverFailed("no worker started for re-timing within "
                                   f"run.start_timeout_s={self.limits.start_timeout_s:g} s")
            for event in self.runtime.poll(0.25):
                self._handle(event)
            if slot not in self.slots:
                raise DriverFailed("the worker started for re-timing died")
        return slot

