"""trials.parquet: the journal's records in index order, with one column per parameter.

Written whole and atomically from the journal (never a Parquet file held open whose footer
comes last), so the file on disk is always a complete table of durable trials.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.atomic import replace_atomically
from storage.readback import open_regular
from storage.schema import RECORD_COLUMNS, TABLE_TYPES

ArrowColumn: TypeAlias = "pa.Array | pa.ChunkedArray"


def _to_table(column: ArrowColumn, type_: pa.DataType) -> ArrowColumn:
    if column.type == type_:
        return column
    if pa.types.is_timestamp(type_):  # seconds as float -> whole microseconds
        micros = pc.cast(pc.round(pc.multiply(column, 1e6)), pa.int64())
        return pc.cast(micros, type_)
    return pc.cast(column, type_)


def _from_table(column: ArrowColumn, type_: pa.DataType) -> ArrowColumn:
    if column.type == type_:
        return column
    if pa.types.is_timestamp(column.type):
        micros = pc.cast(pc.cast(column, pa.timestamp("us")), pa.int64())
        return pc.divide(pc.cast(micros, pa.float64()), 1e6)
    return pc.cast(column, type_)


def build_table(
    records: pa.Table, params: Mapping[str, pa.Array], metadata: Mapping[str, str]
) -> pa.Table:
    """records: the journal's rows sorted by index; params: their parameter values, aligned.
    The parameters' columns go right after `index`."""
    columns: dict[str, ArrowColumn] = {}
    for c in RECORD_COLUMNS:
        columns[c.name] = _to_table(records.column(c.name), TABLE_TYPES.get(c.name, c.type))
        if c.name == "index":
            columns.update(params)
    table = pa.table(columns)
    return table.replace_schema_metadata({k: str(v) for k, v in metadata.items()})


def table_problem(schema: pa.Schema) -> str | None:
    """What keeps a Parquet file's schema from being a trial table's (None: nothing): a
    record column missing or of another type."""
    for c in RECORD_COLUMNS:
        want = TABLE_TYPES.get(c.name, c.type)
        if c.name not in schema.names:
            return f"no column {c.name}"
        if schema.field(c.name).type != want:
            return f"column {c.name} is {schema.field(c.name).type}, not {want}"
    return None


def records_from_table(path: Path | str) -> tuple[pa.Table, dict[str, str]]:
    """The record columns of a written table, in the journal's form, and its metadata:
    reading them back is far faster than re-parsing the journal they came from."""
    table = read_parquet(path, columns=[c.name for c in RECORD_COLUMNS])
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    return pa.table({c.name: _from_table(table.column(c.name), c.type)
                     for c in RECORD_COLUMNS}), meta


def read_parquet(path: Path | str, columns: Sequence[str] | None = None) -> pa.Table:
    """A Parquet file of a run (or one a spec names), read through the one descriptor
    checked to be a regular file: pyarrow's own open of a path blocks on a FIFO swapped
    in after a check, past SIGTERM and SIGINT. FileNotFoundError when it is gone;
    ReadBackError for anything else standing there; pyarrow's errors for a damaged file."""
    with os.fdopen(open_regular(path), "rb") as f:
        data = _arrow_owned(f)
    # columns=[]: the schema and row count alone, not every column.
    return pq.read_table(pa.BufferReader(data),
                         columns=list(columns) if columns is not None else None)


def read_parquet_schema(path: Path | str) -> pa.Schema:
    """The schema (and its metadata) of a Parquet file, read as read_parquet reads the
    file, with the same errors."""
    with os.fdopen(open_regular(path), "rb") as f:
        data = _arrow_owned(f)
    return pq.read_schema(pa.BufferReader(data))


def _arrow_owned(f: object) -> pa.Buffer:
    """The file's bytes in memory pyarrow owns: a scan over a Python file or bytes object
    releases it on one of pyarrow's threads later, taking the GIL, and once the
    interpreter is exiting that aborts the process."""
    fd = f.fileno()  # type: ignore[attr-defined]
    buffer = pa.allocate_buffer(os.fstat(fd).st_size)
    view, filled = memoryview(buffer), 0
    while filled < len(view):
        got = f.readinto(view[filled:])  # type: ignore[attr-defined]
        if not got:
            break
        filled += got
    view.release()
    return buffer.slice(0, filled)


def write_table(path: Path, table: pa.Table) -> None:
    replace_atomically(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def json_metadata(**values: object) -> dict[str, str]:
    """Parquet key-value metadata holds strings: structured values go in as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            for k, v in values.items()}
