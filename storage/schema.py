"""A trial record's columns in Arrow terms, derived from the TrialRecord dataclass, so
that the journal and the table cannot disagree on a column.

The dataclass's fields and type hints are the one definition; the journal and the table
take their schemas from here, so a field added to the record reaches both, and a field of
a type with no column type here fails at import rather than being dropped somewhere. The
table's narrower types live here too, with the ranges they bound, for the journal's reader
to refuse a value the table could not hold.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pyarrow as pa

from storage.records import TrialRecord

# The columns of a trial table that the replay backend reads (actors/replay.py), and that
# a spec's replayed table must have.
REPLAY_COLUMNS = ("config", "status", "validation", "latency_ms", "latency_p20_ms",
                  "latency_p80_ms", "error", "compile_ms", "started_at", "finished_at")

# Python type of a field -> its column type. A config (dict) is stored as canonical JSON.
_ARROW_TYPES: dict[type, pa.DataType] = {
    int: pa.int64(), float: pa.float64(), str: pa.string(), dict: pa.string(),
}


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType  # in the journal's form, which records_from_table also returns
    nullable: bool  # the field's type hint admits None


def column_type(hint: Any) -> tuple[pa.DataType, bool]:
    """(Arrow type, nullable) of a field's type hint: int, float, str, a Literal of strings,
    dict[...], each optionally `| None`."""
    nullable = False
    if get_origin(hint) in (Union, types.UnionType):
        args = get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"no column type for {hint!r}")
        hint, nullable = rest[0], len(rest) < len(args)
    if get_origin(hint) is Literal and all(isinstance(a, str) for a in get_args(hint)):
        return pa.string(), nullable
    base = get_origin(hint) or hint
    if base in _ARROW_TYPES:  # exact: a bool is not an int here
        return _ARROW_TYPES[base], nullable
    raise TypeError(f"no column type for {hint!r}")


def _columns() -> tuple[Column, ...]:
    hints = get_type_hints(TrialRecord)
    return tuple(Column(f.name, *column_type(hints[f.name])) for f in fields(TrialRecord))


RECORD_COLUMNS: tuple[Column, ...] = _columns()
RECORD_SCHEMA = pa.schema([pa.field(c.name, c.type) for c in RECORD_COLUMNS])

TIMESTAMP = pa.timestamp("us", tz="UTC")

# Where the table's type differs from the journal's: narrower counts, real timestamps
# where the journal holds seconds since the epoch. Every other column is as in the journal.
TABLE_TYPES: dict[str, pa.DataType] = {
    "attempt": pa.int32(), "started_at": TIMESTAMP, "finished_at": TIMESTAMP,
}


def _range(type_: pa.DataType) -> tuple[float, float]:
    if type_ == pa.int32():
        return -(2**31), 2**31 - 1
    if type_ == TIMESTAMP:
        return -9.2e12, 9.2e12  # seconds whose microseconds fit in an int64
    raise TypeError(f"no range known for {type_}")


# The journal values a narrowed column can hold in the table (inclusive): the journal's
# reader refuses others, so building the table cannot fail on them.
TABLE_RANGES: dict[str, tuple[float, float]] = {n: _range(t) for n, t in TABLE_TYPES.items()}
