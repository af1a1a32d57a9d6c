"""Space expansion: the product of the value lists in the order written, filtered by the
constraints, each surviving config numbered 0..N-1 in that order.

The space is held as one numpy column per parameter rather than a list of dicts, so a
million-point space expands, filters and indexes in well under a second; a config dict
is built only when a trial is handed out. The product is walked in chunks of points, so
expanding a space of tens of millions of points with constraints needs memory for one
chunk plus the survivors, never for every point.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.records import canonical_json
from sweep.spec.constraints import Constraint

Scalar = bool | int | float | str
CHUNK_POINTS = 1_000_000
JSON_GROUP_TEXTS = 4096  # see Space.config_json_column


def value_kind(values: Sequence[Scalar]) -> type | None:
    """The one type a parameter's values share (int widens to float), or None if mixed."""
    kinds = {bool if isinstance(v, bool) else type(v) for v in values}
    if kinds <= {int, float} and float in kinds:
        return float
    return kinds.pop() if len(kinds) == 1 else None


def parameter_kinds(space: Mapping[str, Sequence[Scalar]]) -> dict[str, type]:
    """Each parameter's value type; mixed lists are held as strings."""
    return {name: value_kind(values) or str for name, values in space.items()}


def union_space(spaces: Sequence[Mapping[str, list[Any]]]) -> dict[str, list[Any]]:
    """Every parameter of the spaces with every value it takes, in order of first
    appearance (values compared by canonical JSON)."""
    values: dict[str, dict[str, Any]] = {}
    for space in spaces:
        for name, vs in space.items():
            for v in vs:
                values.setdefault(name, {}).setdefault(canonical_json(v), v)
    return {name: list(vs.values()) for name, vs in values.items()}


_NUMPY: dict[type, Any] = {bool: np.bool_, int: np.int64, float: np.float64, str: object}
_ARROW = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


class SpaceTooLarge(ValueError):
    """More configs survive the constraints than the caller allows."""

    def __init__(self, configs: int, points: int, limit: int) -> None:
        super().__init__(f"{configs:,} configs after constraints (of {points:,} points); "
                         f"at most {limit:,}")
        self.configs, self.points, self.limit = configs, points, limit


@dataclass(frozen=True)
class Space:
    names: tuple[str, ...]
    kinds: Mapping[str, type]
    columns: Mapping[str, np.ndarray]  # one entry per surviving config, in index order
    size_before_constraints: int
    tables: Mapping[str, np.ndarray]  # each parameter's values, in the order written
    codes: Mapping[str, np.ndarray]  # per surviving config: which entry of its table
    # A sweep over several problems (concatenate): the problem keys that vary, which lead
    # `names` and each config a worker gets, and the first index of each problem's configs.
    # A trial's record holds the kernel's config alone (config_json).
    problem_keys: tuple[str, ...] = ()
    starts: tuple[int, ...] = (0,)
    # Parameters that some configs leave unset (a configs list, or problems of different
    # parameters): per config, whether it sets the parameter. Where it does not, its code
    # is 0 and its column holds a placeholder; no config, record or launch holds it, and
    # the trial table holds null. Names every config sets have no entry: empty for a
    # product, so every fast path stays.
    present: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns[self.names[0]]) if self.names else 0

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """The parameters: names without the problem keys."""
        return self.names[len(self.problem_keys):]

    def config(self, index: int) -> dict[str, Any]:
        """The trial's config as a worker gets it: the problem keys (if any) and the
        parameters it sets."""
        return {name: self.kinds[name](self.columns[name][index]) for name in self.names
                if name not in self.present or self.present[name][index]}

    def kernel_config(self, index: int) -> dict[str, Any]:
        """The config the kernel is launched with: the parameters it sets, alone."""
        return {name: self.kinds[name](self.columns[name][index]) for name in self.kernel_names
                if name not in self.present or self.present[name][index]}

    def levels(self, name: str) -> tuple[np.ndarray, int]:
        """Each config's code of `name` and the count of codes, unset being a code of its
        own (the last): what a search compares configs by."""
        codes, size = self.codes[name], len(self.tables[name])
        if name not in self.present:
            return codes, size
        return np.where(self.present[name], codes.astype(np.int64), size), size + 1

    def problem_of(self, index: int) -> int:
        """Which problem (0 for a sweep of one) the config at index belongs to."""
        return bisect.bisect_right(self.starts, index) - 1

    def problem_range(self, problem: int) -> range:
        end = self.starts[problem + 1] if problem + 1 < len(self.starts) else len(self)
        return range(self.starts[problem], end)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each problem's count of configs (one entry for a sweep of one)."""
        return tuple(len(self.problem_range(p)) for p in range(len(self.starts)))

    def part(self, problem: int) -> Space:
        """One problem's configs as a space of their own (its parameters alone, indexed
        from 0 in the same order): what a search of that problem works on."""
        at = self.problem_range(problem)
        cut = slice(at.start, at.stop)
        present = {n: p[cut] for n, p in self.present.items() if n in self.kernel_names}
        names = tuple(n for n in self.kernel_names if n not in present or present[n].any())
        return Space(names=names, kinds={n: self.kinds[n] for n in names},
                     columns={n: self.columns[n][cut] for n in names},
                     size_before_constraints=len(at),
                     tables={n: self.tables[n] for n in names},
                     codes={n: self.codes[n][cut] for n in names},
                     present={n: p for n, p in present.items() if n in names and not p.all()})

    def configs(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """config(i) for each index, at once: a column's values are taken for all of them
        in one step (the driver hands out tens of thousands a second)."""
        if not indices:
            return []
        at = np.fromiter(indices, dtype=np.int64, count=len(indices))
        values = []
        for name in self.names:
            kind, column = self.kinds[name], self.columns[name][at].tolist()
            values.append(column if type(column[0]) is kind else list(map(kind, column)))
        names = self.names
        rows = [dict(zip(names, row)) for row in zip(*values)]
        for name, present in self.present.items():
            for row, here in zip(rows, present[at].tolist()):
                if not here:
                    del row[name]
        return rows

    def config_json(self, index: int) -> str:
        """The record's config: kernel_config's, as canonical JSON."""
        return canonical_json(self.kernel_config(index))

    def arrow_columns(self, indices: np.ndarray) -> dict[str, pa.Array]:
        """Each name's column of the trial table at these indices: null where unset."""
        return {name: pa.array(self.columns[name][indices], type=_ARROW[self.kinds[name]],
                               mask=~self.present[name][indices]
                               if name in self.present else None)
                for name in self.names}

    def config_json_column(self, indices: np.ndarray) -> pa.Array:
        """config_json(i) for each index, as one arrow string array, without a Python call
        per config: the parameters (in canonical_json's sorted order) are grouped so that
        each group has few value combinations, the JSON text of each combination needed
        is built once (all of a group's, cached, when the rows outnumber them), and the
        rows are assembled by arrow from one take per group."""
        indices = np.asarray(indices, dtype=np.int64)
        if any(name in self.present for name in self.kernel_names):
            # Unset parameters break the grouping into value combinations: one text a row
            # (an explicit configs list is hundreds of configs, not millions).
            return pa.array([self.config_json(i) for i in indices.tolist()], type=pa.string())
        groups = self._json_groups
        parts = []
        for i, group in enumerate(groups):
            code = np.zeros(len(indices), dtype=np.int64)
            for name in group:
                code = code * len(self.tables[name]) + self.codes[name][indices]
            edges = ("{" if i == 0 else "", "}" if i == len(groups) - 1 else "")
            combinations = math.prod(len(self.tables[name]) for name in group)
            if len(indices) < combinations:  # a few rows: encode just theirs
                needed, rows = np.unique(code, return_inverse=True)
                texts = pa.array([self._group_text(group, c, edges) for c in needed.tolist()],
                                 type=pa.string())
                parts.append(texts.take(pa.array(rows.reshape(-1))))
            else:
                parts.append(self._all_texts(i, edges).take(pa.array(code)))
        if not parts:
            return pa.array(["{}"] * len(indices), type=pa.string())
        if len(parts) == 1:
            return parts[0]
        return pc.binary_join_element_wise(*parts, ",")

    @functools.cached_property
    def _json_groups(self) -> list[list[str]]:
        """Runs of sorted parameter names with at most JSON_GROUP_TEXTS value combinations
        (or a single parameter)."""
        groups: list[list[str]] = []
        combinations = 0
        for name in sorted(self.kernel_names):
            size = len(self.tables[name])
            if groups and combinations * size <= JSON_GROUP_TEXTS:
                groups[-1].append(name)
                combinations *= size
            else:
                groups.append([name])
                combinations = size
        return groups

    def _encoded(self, name: str, code: int) -> str:
        value = self.kinds[name](self.tables[name][code])
        return json.dumps(name, ensure_ascii=False) + ":" + json.dumps(value, ensure_ascii=False)

    def _group_text(self, group: list[str], code: int, edges: tuple[str, str]) -> str:
        """The JSON text of one combination (a mixed-radix code, last name fastest)."""
        parts = []
        for name in reversed(group):
            code, digit = divmod(code, len(self.tables[name]))
            parts.append(self._encoded(name, digit))
        return edges[0] + ",".join(reversed(parts)) + edges[1]

    def _all_texts(self, i: int, edges: tuple[str, str]) -> pa.Array:
        """Every combination's text of group i, in code order, built once per space."""
        cache = self.__dict__.setdefault("_texts", {})
        if i not in cache:
            group = self._json_groups[i]
            encoded = [[self._encoded(name, c) for c in range(len(self.tables[name]))]
                       for name in group]
            cache[i] = pa.array([edges[0] + ",".join(combo) + edges[1]
                                 for combo in itertools.product(*encoded)], type=pa.string())
        return cache[i]

def concatenate(parts: Sequence[Space], keys: Sequence[str],
                values: Sequence[Sequence[Scalar]]) -> Space:
    """One space of several problems' spaces, problem-major: each config carries the problem
    keys that vary, values[p] for part p, as leading columns. The parameters are every
    part's, in order of first appearance; a part without one leaves it unset."""
    sizes = [len(part) for part in parts]
    starts = tuple(int(s) for s in np.cumsum([0, *sizes[:-1]]))
    kinds: dict[str, type] = {}
    tables: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    for k, key in enumerate(keys):
        column = [row[k] for row in values]
        kinds[key] = value_kind(column) or str
        tables[key], code_of = _table_of(kinds[key], column)
        codes[key] = np.repeat(code_of, sizes)
    names = tuple(dict.fromkeys(n for part in parts for n in part.names))
    for name in names:
        kinds[name], tables[name], codes[name], here = _joined(name, parts)
        if not here.all():
            present[name] = here
    columns = {name: tables[name][codes[name]] for name in tables}
    return Space(names=(*keys, *names), kinds=kinds, columns=columns,
                 size_before_constraints=sum(p.size_before_constraints for p in parts),
                 tables=tables, codes=codes, problem_keys=tuple(keys), starts=starts,
                 present=present)


def _table_of(kind: type, values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values (as `kind`, compared by canonical JSON: 1 and 1.0 are one
    float), in order of first appearance, and each value's code in that table."""
    code_of_text: dict[str, int] = {}
    code_of = [code_of_text.setdefault(canonical_json(kind(v)), len(code_of_text))
               for v in values]
    table = np.array([kind(json.loads(t)) for t in code_of_text], dtype=_NUMPY[kind])
    return table, np.array(code_of, dtype=np.int64)


def _joined(name: str, parts: Sequence[Space]) -> tuple[type, np.ndarray, np.ndarray,
                                                        np.ndarray]:
    """One parameter over the parts: its kind (widened as value_kind does; mixed: str), its
    table (the union of the parts' values, recoded), codes and where it is set."""
    owners = [p for p in parts if name in p.names]
    first = owners[0]
    if all(p.kinds[name] is first.kinds[name] and np.array_equal(p.tables[name], first.tables[name])
           for p in owners):  # one space over the problems: the table as it is
        kind, table = first.kinds[name], first.tables[name]
        recode: list[np.ndarray | None] = [None] * len(owners)
    else:
        kind = value_kind([v for p in owners for v in p.tables[name].tolist()]) or str
        table, code_of = _table_of(kind, [v for p in owners for v in p.tables[name].tolist()])
        bounds = np.cumsum([0, *(len(p.tables[name]) for p in owners)])
        recode = [code_of[a:b] for a, b in itertools.pairwise(bounds)]
    codes, here = [], []
    mapping = dict(zip(map(id, owners), recode))
    for part in parts:
        if name not in part.names:
            codes.append(np.zeros(len(part), dtype=np.int64))
            here.append(np.zeros(len(part), dtype=bool))
            continue
        to = mapping[id(part)]
        codes.append(part.codes[name] if to is None else to[part.codes[name]])
        here.append(part.present.get(name, np.ones(len(part), dtype=bool)))
    return kind, table, np.concatenate(codes), np.concatenate(here)


def expand_configs(configs: Sequence[Mapping[str, Scalar]],
                   constraints: Sequence[Constraint]) -> Space:
    """An explicit list of configs, in the order written, less those a constraint refuses.
    A config without a parameter others set leaves it unset (the kernel's default applies);
    a constraint reading a parameter a config leaves unset does not refuse it."""
    names = tuple(dict.fromkeys(n for c in configs for n in c))
    kinds = parameter_kinds({n: [c[n] for c in configs if n in c] for n in names})
    tables, codes, present = {}, {}, {}
    for n in names:
        here = np.array([n in c for c in configs], dtype=bool)
        tables[n], set_codes = _table_of(kinds[n], [c[n] for c in configs if n in c])
        codes[n] = np.zeros(len(configs), dtype=np.int64)
        codes[n][here] = set_codes
        present[n] = here
    columns = {n: tables[n][codes[n]] for n in names}
    keep = np.ones(len(configs), dtype=bool)
    for constraint in constraints:
        unset = np.zeros(len(configs), dtype=bool)
        for n in constraint.names:
            unset |= ~present[n]
        keep &= constraint.mask(columns, len(configs)) | unset
    at = np.flatnonzero(keep)
    names = tuple(n for n in names if present[n][at].any())
    return Space(names=names, kinds={n: kinds[n] for n in names},
                 columns={n: columns[n][at] for n in names},
                 size_before_constraints=len(configs), tables={n: tables[n] for n in names},
                 codes={n: codes[n][at] for n in names},
                 present={n: present[n][at] for n in names if not present[n][at].all()})


def _strides(sizes: Sequence[int]) -> list[int]:
    """Mixed-radix place values with the last parameter fastest: itertools.product's
    order."""
    strides = []
    stride = math.prod(sizes)
    for size in sizes:
        stride //= size
        strides.append(stride)
    return strides


def expand(space: Mapping[str, Sequence[Scalar]], constraints: Sequence[Constraint], *,
           chunk_points: int = CHUNK_POINTS, max_configs: int | None = None) -> Space:
    """The configs of `space` that satisfy every constraint, in product order. Raises
    SpaceTooLarge when more than max_configs survive."""
    names = tuple(space)
    kinds = parameter_kinds(space)
    tables = {n: np.array([kinds[n](v) for v in space[n]], dtype=_NUMPY[kinds[n]])
              for n in names}
    sizes = [len(tables[n]) for n in names]
    total = math.prod(sizes) if sizes else 0
    strides = dict(zip(names, _strides(sizes)))

    def digits(name: str, positions: np.ndarray) -> np.ndarray:
        size = len(tables[name])
        dtype = np.uint8 if size <= 1 << 8 else np.uint16 if size <= 1 << 16 else np.int64
        return ((positions // strides[name]) % size).astype(dtype)

    if constraints:
        needed = frozenset().union(*(c.names for c in constraints))
        kept: list[np.ndarray] = []
        count = 0
        for start in range(0, total, chunk_points):
            positions = np.arange(start, min(start + chunk_points, total), dtype=np.int64)
            chunk = {name: tables[name][digits(name, positions)] for name in needed}
            keep = np.ones(len(positions), dtype=bool)
            for constraint in constraints:
                keep &= constraint.mask(chunk, len(positions))
            count += int(keep.sum())
            # Past the cap only the count goes on, for the message.
            if max_configs is None or count <= max_configs:
                kept.append(positions[keep])
            else:
                kept.clear()
        if max_configs is not None and count > max_configs:
            raise SpaceTooLarge(count, total, max_configs)
        survivors = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
    else:
        if max_configs is not None and total > max_configs:
            raise SpaceTooLarge(total, total, max_configs)
        survivors = np.arange(total, dtype=np.int64)
    codes = {name: digits(name, survivors) for name in names}
    columns = {name: tables[name][codes[name]] for name in names}
    return Space(names=names, kinds=kinds, columns=columns, size_before_constraints=total,
                 tables=tables, codes=codes)
