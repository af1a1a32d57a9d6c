"""trials.parquet: the journal's records in index order, with one column per parameter.

Written whole and atomically from the journal (never a Parquet file held open whose footer
comes last), so the file on disk is always a complete table of durable trials.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.atomic import replace_atomically

TIMESTAMP = pa.timestamp("us", tz="UTC")


def _timestamps(seconds: pa.ChunkedArray) -> pa.Array:
    micros = pc.cast(pc.round(pc.multiply(seconds, 1e6)), pa.int64())
    return pc.cast(micros, TIMESTAMP)


def build_table(
    records: pa.Table, params: Mapping[str, pa.Array], metadata: Mapping[str, str]
) -> pa.Table:
    """records: the journal's rows sorted by index; params: their parameter values, aligned."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {"index": records.column("index")}
    columns.update(params)
    for name in ("config", "status", "latency_ms", "latency_p20_ms", "latency_p80_ms",
                 "validation", "error", "compile_ms", "device", "node", "worker"):
        columns[name] = records.column(name)
    columns["attempt"] = pc.cast(records.column("attempt"), pa.int32())
    columns["started_at"] = _timestamps(records.column("started_at"))
    columns["finished_at"] = _timestamps(records.column("finished_at"))
    table = pa.table(columns)
    return table.replace_schema_metadata({k: str(v) for k, v in metadata.items()})


def records_from_table(path) -> tuple[pa.Table, dict[str, str]]:
    """The record columns of a written table, in the journal's form, and its metadata:
    reading them back is far faster than re-parsing the journal they came from."""
    table = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    columns = {name: table.column(name) for name in (
        "index", "config", "status", "validation", "latency_ms", "latency_p20_ms",
        "latency_p80_ms", "error", "compile_ms", "device", "node", "worker")}
    columns["attempt"] = pc.cast(table.column("attempt"), pa.int64())
    for name in ("started_at", "finished_at"):
        micros = pc.cast(pc.cast(table.column(name), pa.timestamp("us")), pa.int64())
        columns[name] = pc.divide(pc.cast(micros, pa.float64()), 1e6)
    return pa.table(columns), meta


def write_table(path, table: pa.Table) -> None:
    replace_atomically(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def json_metadata(**values: object) -> dict[str, str]:
    """Parquet key-value metadata holds strings: structured values go in as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            for k, v in values.items()}
