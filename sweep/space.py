"""Space expansion: the product of the value lists in the order written, filtered by the
constraints, each surviving config numbered 0..N-1 in that order.

The space is held as one numpy column per parameter rather than a list of dicts, so a
million-point space expands, filters and indexes in well under a second; a config dict
is built only when a trial is handed out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from storage.records import canonical_json
from sweep.constraints import Constraint

Scalar = bool | int | float | str


def value_kind(values: Sequence[Scalar]) -> type | None:
    """The one type a parameter's values share (int widens to float), or None if mixed."""
    kinds = {bool if isinstance(v, bool) else type(v) for v in values}
    if kinds <= {int, float} and float in kinds:
        return float
    return kinds.pop() if len(kinds) == 1 else None


_NUMPY = {bool: np.bool_, int: np.int64, float: np.float64, str: object}
_ARROW = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


@dataclass(frozen=True)
class Space:
    names: tuple[str, ...]
    kinds: Mapping[str, type]
    columns: Mapping[str, np.ndarray]  # one entry per surviving config, in index order
    size_before_constraints: int

    def __len__(self) -> int:
        return len(self.columns[self.names[0]]) if self.names else 0

    def config(self, index: int) -> dict[str, Any]:
        return {name: self.kinds[name](self.columns[name][index]) for name in self.names}

    def config_json(self, index: int) -> str:
        return canonical_json(self.config(index))

    def arrow_columns(self, indices: np.ndarray) -> dict[str, pa.Array]:
        return {name: pa.array(self.columns[name][indices], type=_ARROW[self.kinds[name]])
                for name in self.names}


def expand(space: Mapping[str, Sequence[Scalar]], constraints: Sequence[Constraint]) -> Space:
    names = tuple(space)
    lists = [list(space[n]) for n in names]
    kinds = {n: value_kind(vs) or str for n, vs in zip(names, lists)}
    sizes = [len(vs) for vs in lists]
    total = int(np.prod(sizes, dtype=np.int64)) if sizes else 0
    # Mixed-radix digits with the last parameter fastest: itertools.product's order.
    positions = np.arange(total, dtype=np.int64)
    columns: dict[str, np.ndarray] = {}
    stride = total
    for name, values, size in zip(names, lists, sizes):
        stride //= size
        digits = (positions // stride) % size
        table = np.array([kinds[name](v) for v in values], dtype=_NUMPY[kinds[name]])
        columns[name] = table[digits]
    keep = np.ones(total, dtype=bool)
    for constraint in constraints:
        keep &= constraint.mask(columns, total)
    if not keep.all():
        columns = {name: col[keep] for name, col in columns.items()}
    return Space(names=names, kinds=kinds, columns=columns, size_before_constraints=total)
