"""Running totals of a sweep: counts by status and the best config so far."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from storage.records import TrialRecord
from storage.snapshot import Best


@dataclass
class Tally:
    total: int
    counts: Counter[str] = field(default_factory=Counter)
    best: Best | None = None

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
            if r.status == "ok" and r.latency_ms is not None and (
                    self.best is None
                    or (r.latency_ms, r.index) < (self.best.latency_ms, self.best.index)):
                self.best = Best(r.index, r.config, r.latency_ms, r.device)

    @classmethod
    def from_journal(cls, total: int, table: pa.Table) -> Tally:
        """Rebuild from journal rows without touching them row by row in Python."""
        import json

        tally = cls(total=total)
        if table.num_rows == 0:
            return tally
        for item in pc.value_counts(table.column("status")).to_pylist():
            tally.counts[item["values"]] = item["counts"]
        ok = table.filter(pc.equal(table.column("status"), "ok"))
        if ok.num_rows:
            i = pc.index(ok.column("latency_ms"), pc.min(ok.column("latency_ms"))).as_py()
            row = ok.slice(i, 1).to_pylist()[0]
            tally.best = Best(row["index"], json.loads(row["config"]), row["latency_ms"],
                              row["device"])
        return tally
