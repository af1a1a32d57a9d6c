"""The append-only trial journal: the durable truth of a run.

One JSON object a line, appended with a single write and fsync'd before the trials count
as done (group commit: the driver appends everything that arrived in one loop turn at once).
A crash can tear only the last line, which carries no newline yet; reading ignores it and
opening for append cuts it off, so the next line starts clean. A malformed line with good
lines after it is real corruption and is reported, never skipped silently.

Reading goes through pyarrow's JSON reader (C++, multithreaded), which keeps a resume of a
million-trial run within seconds; Python's json only serves the rare damaged file.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as paj

from storage.records import TrialRecord, canonical_json

JOURNAL_SCHEMA = pa.schema([
    ("index", pa.int64()),
    ("config", pa.string()),
    ("status", pa.string()),
    ("validation", pa.string()),
    ("latency_ms", pa.float64()),
    ("latency_p20_ms", pa.float64()),
    ("latency_p80_ms", pa.float64()),
    ("error", pa.string()),
    ("compile_ms", pa.float64()),
    ("device", pa.string()),
    ("node", pa.string()),
    ("worker", pa.string()),
    ("attempt", pa.int64()),
    ("started_at", pa.float64()),
    ("finished_at", pa.float64()),
])


class JournalError(Exception):
    """The journal is damaged somewhere other than its last line."""


def encode(record: TrialRecord) -> bytes:
    data = record.to_json()
    data["config"] = canonical_json(data["config"])
    return (json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _complete_part(raw: bytes) -> bytes:
    """Everything up to the last newline: a torn final line is not part of the journal."""
    end = raw.rfind(b"\n")
    return raw[: end + 1] if end >= 0 else b""


class Journal:
    """Appends lines durably. Opening cuts a torn tail left by a crash."""

    def __init__(self, path: Path) -> None:
        self.path = path
        raw = path.read_bytes() if path.exists() else b""
        keep = len(_complete_part(raw))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if keep != len(raw):
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)

    def append(self, lines: Iterable[bytes]) -> int:
        """Write and fsync newline-terminated lines; returns the bytes written."""
        payload = b"".join(lines)
        if payload:
            os.write(self._fd, payload)
            os.fsync(self._fd)
        return len(payload)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_records(journal: Journal, records: Iterable[TrialRecord]) -> int:
    return journal.append(encode(r) for r in records)


def encode_attempt(index: int, attempt: int, event: str) -> bytes:
    """An attempt spent without a record: its worker "died", or the run was "interrupted"."""
    return (json.dumps({"index": index, "attempt": attempt, "event": event}) + "\n").encode()


def read_attempts(path: Path) -> tuple[dict[int, int], dict[int, int]]:
    """(highest attempt spent, worker deaths) per index, from the attempt log."""
    raw = _complete_part(path.read_bytes()) if path.exists() else b""
    spent: dict[int, int] = {}
    deaths: dict[int, int] = {}
    for line in raw.splitlines():
        try:
            event = json.loads(line)
            index, attempt = int(event["index"]), int(event["attempt"])
        except (ValueError, KeyError, TypeError):
            continue  # a lost event only makes `attempt` smaller, never loses a trial
        spent[index] = max(spent.get(index, 0), attempt)
        if event.get("event") == "died":
            deaths[index] = deaths.get(index, 0) + 1
    return spent, deaths


def read_journal(path: Path, start: int = 0,
                 before: pa.Table | None = None) -> tuple[pa.Table, int]:
    """Every durable record from byte `start` on, after the records `before` (read earlier,
    e.g. from the table), once per index (the first wins), sorted by index; and the byte
    offset where the complete part of the journal ends."""
    raw = b""
    if path.exists():
        with open(path, "rb") as f:
            f.seek(start)
            raw = _complete_part(f.read())
    end = start + len(raw)
    table = JOURNAL_SCHEMA.empty_table()
    if raw:
        try:
            table = paj.read_json(
                io.BytesIO(raw),
                parse_options=paj.ParseOptions(explicit_schema=JOURNAL_SCHEMA,
                                               unexpected_field_behavior="error"),
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            table = _read_slowly(path, raw)
        table = table.select(JOURNAL_SCHEMA.names)
    if before is not None and before.num_rows:
        table = pa.concat_tables([before.select(JOURNAL_SCHEMA.names).cast(JOURNAL_SCHEMA),
                                  table])
    return _first_per_index(table), end


def _read_slowly(path: Path, raw: bytes) -> pa.Table:
    rows: list[dict] = []
    lines = raw.split(b"\n")[:-1]
    bad_at: int | None = None
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or set(row) != set(JOURNAL_SCHEMA.names):
                raise ValueError("not a trial record")
        except ValueError:
            bad_at = bad_at or number
            continue
        if bad_at is not None:
            raise JournalError(f"{path}: line {bad_at}: damaged record followed by good ones")
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=JOURNAL_SCHEMA)


def _first_per_index(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    # Stable sort keeps journal order among equal indices, so the first arrival survives.
    order = pc.sort_indices(table, sort_keys=[("index", "ascending")])
    table = table.take(order)
    index = table.column("index").to_numpy()
    if len(index) > 1 and (index[1:] == index[:-1]).any():
        keep = np.ones(len(index), dtype=bool)
        keep[1:] = index[1:] != index[:-1]
        table = table.filter(pa.array(keep))
    return table
