"""Running totals of a sweep: counts by status and the best config so far (in a sweep over
problems, also per problem: a best across problems means nothing)."""

from __future__ import annotations

import bisect
import heapq
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from storage.records import PRUNED, Best, TrialRecord

LEADERS = 16  # how many of the fastest a tally keeps, for re-timing finalists


@dataclass
class Tally:
    total: int
    counts: Counter[str] = field(default_factory=Counter)
    best: Best | None = None
    # The best on each device type (the device records carry); on a cluster of one type,
    # just `best`.
    by_device: dict[str, Best] = field(default_factory=dict)
    # Per device type, the fastest LEADERS ok trials as a max-heap of (-latency, -index,
    # Best).
    _leaders: dict[str, list[tuple[float, int, Best]]] = field(default_factory=dict,
                                                              repr=False)
    # A sweep over problems: the first index of each problem's configs (Space.starts), and
    # a tally of each problem's own trials (their indices stay the sweep's).
    starts: tuple[int, ...] = (0,)
    problems: list[Tally] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.starts) > 1 and not self.problems:
            ends = [*self.starts[1:], self.total]
            self.problems = [Tally(total=end - start)
                             for start, end in zip(self.starts, ends)]

    def problem(self, p: int) -> Tally:
        """Problem p's tally (this one, in a sweep of one problem)."""
        return self.problems[p] if self.problems else self

    @property
    def headline(self) -> Tally:
        """The tally whose best a run's best.json leads with: the first problem's."""
        return self.problem(0)

    def leaders(self, k: int, device: str | None = None) -> list[Best]:
        """The k fastest ok trials so far (on the device type, if given), fastest first
        (ties to the lower index)."""
        heaps = [self._leaders.get(device, [])] if device is not None else \
            self._leaders.values()
        ranked = sorted((e for heap in heaps for e in heap), key=lambda e: (-e[0], -e[1]))
        return [b for _, _, b in ranked[:k]]

    @property
    def devices(self) -> list[str]:
        """Device types with an ok trial."""
        return sorted(self._leaders)

    def _offer(self, best: Best) -> None:
        heap = self._leaders.setdefault(best.device, [])
        entry = (-best.latency_ms, -best.index, best)
        if len(heap) < LEADERS:
            heapq.heappush(heap, entry)
        elif entry[:2] > heap[0][:2]:
            heapq.heapreplace(heap, entry)
        # Ties go to the lower index, so the best does not depend on completion order.
        mine = self.by_device.get(best.device)
        if mine is None or (best.latency_ms, best.index) < (mine.latency_ms, mine.index):
            self.by_device[best.device] = best
            if self.best is None or \
                    (best.latency_ms, best.index) < (self.best.latency_ms, self.best.index):
                self.best = best

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    @property
    def failed(self) -> int:
        return self.done - self.counts.get("ok", 0) - self.counts.get(PRUNED, 0)

    def add(self, records: Iterable[TrialRecord]) -> None:
        if self.problems:
            records = list(records)
            for r in records:
                self.problems[bisect.bisect_right(self.starts, r.index) - 1].add((r,))
        for r in records:
            self.counts[r.status] += 1
            if r.status != "ok" or r.latency_ms is None:
                continue
            heap = self._leaders.get(r.device)
            # Most records are slower than the device's leaders: no Best for them.
            if heap is not None and len(heap) >= LEADERS and \
                    (-r.latency_ms, -r.index) <= heap[0][:2]:
                continue
            self._offer(Best(r.index, r.config, r.latency_ms, r.device))

    def set_best(self, winners: dict[str, Best]) -> None:
        """The re-timed winner of each device type; the fastest of them is the best."""
        self.by_device.update(winners)
        self.best = min(self.by_device.values(), key=lambda b: (b.latency_ms, b.index))

    @classmethod
    def from_journal(cls, total: int, table: pa.Table,
                     starts: tuple[int, ...] = (0,)) -> Tally:
        """Rebuild from journal rows without touching them row by row in Python."""
        tally = cls._from_rows(total, table)
        if len(starts) > 1:
            ends = [*starts[1:], total]
            index = table.column("index")
            tally.starts = starts
            tally.problems = [cls._from_rows(end - start, table.filter(pc.and_(
                pc.greater_equal(index, start), pc.less(index, end))))
                for start, end in zip(starts, ends)]
        return tally

    @classmethod
    def _from_rows(cls, total: int, table: pa.Table) -> Tally:
        tally = cls(total=total)
        if table.num_rows == 0:
            return tally
        for item in pc.value_counts(table.column("status")).to_pylist():
            tally.counts[item["values"]] = item["counts"]
        ok = table.filter(pc.equal(table.column("status"), "ok"))
        for device in pc.unique(ok.column("device")).to_pylist():
            mine = ok.filter(pc.equal(ok.column("device"), device))
            order = pc.sort_indices(mine, sort_keys=[("latency_ms", "ascending"),
                                                     ("index", "ascending")])
            for row in mine.take(order[:LEADERS]).to_pylist():
                tally._offer(Best(row["index"], json.loads(row["config"]), row["latency_ms"],
                                  row["device"]))
        return tally
