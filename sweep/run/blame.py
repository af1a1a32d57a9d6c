"""Who a worker's death falls on. Messages sent just before a process dies can be lost, so
a death is first only a suspicion of the trial its worker was running: the suspect runs
again alone, on a worker with nothing else queued ("probation"), where a death is
certainly its own. A trial whose worker died more than max_retries times, the last on
probation, is `crashed`. Deaths count across sessions (the attempt log keeps them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class Blame:
    def __init__(self, deaths: Mapping[int, int], max_retries: int) -> None:
        """deaths: each trial's deaths so far (earlier sessions' too)."""
        self.deaths = dict(deaths)
        self.max_retries = max_retries
        # A trial whose worker died (possibly in an earlier session) runs alone next time.
        self.suspects: set[int] = set(deaths)

    def died(self, index: int, alone: bool) -> bool:
        """A worker died running trial index (alone: on probation); whether the trial is
        now `crashed` (else it runs again, alone)."""
        self.deaths[index] = self.deaths.get(index, 0) + 1
        if alone and self.deaths[index] > self.max_retries:
            self.suspects.discard(index)
            return True
        self.suspects.add(index)
        return False

    def finished(self, indices: Iterable[int]) -> None:
        """Trials that came back with a record: no longer suspects."""
        if self.suspects:
            self.suspects.difference_update(indices)
