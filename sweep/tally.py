"""Running totals of a sweep: counts by status and the best config so far."""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from storage.records import TrialRecord
from storage.snapshot import Best

LEADERS = 16  # how many of the fastest a tally keeps, for re-timing finalists


@dataclass
class Tally:
    total: int
    counts: Counter[str] = field(default_factory=Counter)
    best: Best | None = None
    # The fastest LEADERS ok trials as a max-heap of (-latency, -index, Best).
    _leaders: list[tuple[float, int, Best]] = field(default_factory=list, repr=False)

    def leaders(self, k: int) -> list[Best]:
        """The k fastest ok trials so far, fastest first (ties to the lower index)."""
        ranked = sorted(self._leaders, key=lambda e: (-e[0], -e[1]))
        return [b for _, _, b in ranked[:k]]

    def _offer(self, best: Best) -> None:
        entry = (-best.latency_ms, -best.index, best)
        if len(self._leaders) < LEADERS:
            heapq.heappush(self._leaders, entry)
        elif entry[:2] > self._leaders[0][:2]:
            heapq.heapreplace(self._leaders, entry)

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    @property
    def failed(self) -> int:
        return self.done - self.counts.get("ok", 0)

    def add(self, records: Iterable[TrialRecord]) -> None:
        for r in records:
            self.counts[r.status] += 1
            # Ties go to the lower index, so the best does not depend on completion order.
            if r.status != "ok" or r.latency_ms is None:
                continue
            candidate = Best(r.index, r.config, r.latency_ms, r.device)
            self._offer(candidate)
            if self.best is None or \
                    (r.latency_ms, r.index) < (self.best.latency_ms, self.best.index):
                self.best = candidate

    @classmethod
    def from_journal(cls, total: int, table: pa.Table) -> Tally:
        """Rebuild from journal rows without touching them row by row in Python."""
        tally = cls(total=total)
        if table.num_rows == 0:
            return tally
        for item in pc.value_counts(table.column("status")).to_pylist():
            tally.counts[item["values"]] = item["counts"]
        ok = table.filter(pc.equal(table.column("status"), "ok"))
        if ok.num_rows:
            order = pc.sort_indices(ok, sort_keys=[("latency_ms", "ascending"),
                                                   ("index", "ascending")])
            for row in ok.take(order[:LEADERS]).to_pylist():
                tally._offer(Best(row["index"], json.loads(row["config"]), row["latency_ms"],
                                  row["device"]))
            tally.best = tally.leaders(1)[0]
        return tally
