"""A run's failures grouped by cause: the analysis records them for every report, and the
end-of-run summary names the commonest, so both group them by one rule."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storage.records import PRUNED

if TYPE_CHECKING:
    import pyarrow as pa

# Numbers in an error's text (a max error, a size) would split one cause into many groups.
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass(frozen=True)
class ErrorGroup:
    """Failed trials whose errors have the same cause: a status and a first line that
    differ in numbers alone."""

    status: str
    count: int
    example: str  # the first such trial's first line
    index: int  # that trial's index


def common_errors(table: pa.Table, top: int = 5) -> list[ErrorGroup]:
    """The commonest failures of a trial table (columns index, status, error), commonest
    first (ties: the lower index)."""
    rows = zip(table.column("index").to_pylist(), table.column("status").to_pylist(),
               table.column("error").to_pylist())
    return _group(((i, s, e) for i, s, e in rows if s not in ("ok", PRUNED)), top)


def _group(failures: Iterable[tuple[int, str, str | None]], top: int) -> list[ErrorGroup]:
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for index, status, error in sorted(failures):
        line = (error or "").strip().splitlines()[0][:200] if (error or "").strip() \
            else "(no error text)"
        groups.setdefault((status, _NUMBER.sub("#", line)), []).append((index, line))
    ranked = sorted(groups.items(), key=lambda g: (-len(g[1]), g[1][0][0]))
    return [ErrorGroup(status, len(members), members[0][1], members[0][0])
            for (status, _), members in ranked[:top]]
