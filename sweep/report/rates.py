"""A trial's throughput as every view shows it (the text report, the HTML page's tables):
one rule for which rate a table shows and in which unit, so the views' columns agree."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sweep.numbers import amount, scale, significant

if TYPE_CHECKING:
    from sweep.report.analysis import Analysis, Ranked

# The rate a table's column shows: (the trial's field, its unit, the unit's size in the
# field's unit), FLOP/s where the kernel gives its flops, else B/s.
RATE_FIELDS = {"flops": ("tflops", "FLOP/s", 1e12), "bytes_moved": ("gbps", "B/s", 1e9)}


def rates(r: Ranked) -> list[str]:
    """A trial's throughput, each in the unit that reads best: 16.2 MFLOP/s, 378 kB/s."""
    return ([amount(r.tflops * 1e12, "FLOP/s")] if r.tflops is not None else []) + \
        ([amount(r.gbps * 1e9, "B/s")] if r.gbps is not None else [])


def rate_field(a: Analysis) -> tuple[str, str, float] | None:
    return next((RATE_FIELDS[k] for k in RATE_FIELDS if k in a.work), None)


def rate_column(a: Analysis, rows: Iterable[Ranked]) -> tuple[str, list[str]]:
    """A table's rate column: its heading, the one unit that puts the column's largest
    value between 1 and 1000 (so values compare), and each row's cell in it."""
    rows = list(rows)
    field = rate_field(a)
    if field is None:
        return "", ["" for _ in rows]
    name, unit, size = field
    values = [getattr(r, name) for r in rows]
    heading, factor = scale([v * size for v in values if v is not None], unit)
    return heading, ["" if v is None else significant(v * size * factor, 3) for v in values]
