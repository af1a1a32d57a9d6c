"""The journal, the trial record and the Parquet table: what survives a crash."""

import json
import random
import time
import types
from dataclasses import fields
from typing import Literal, get_args, get_origin, get_type_hints

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.journal import (
    JOURNAL_SCHEMA,
    Journal,
    JournalError,
    RecordCheck,
    append_records,
    read_attempts,
    read_journal,
)
from storage.lines import encode_attempt
from storage.records import (
    MAX_ERROR_CHARS,
    STATUSES,
    TABLE_COLUMNS,
    Best,
    TrialOutcome,
    TrialRecord,
    Where,
    canonical_json,
)
from storage.schema import RECORD_SCHEMA, column_type
from storage.snapshot import Snapshot, SnapshotError, read_snapshot, write_snapshot
from storage.table import TABLE_TYPES, build_table, records_from_table, write_table

RUN = "0123456789abcdef"


def configs_of(indices: np.ndarray) -> pa.Array:
    return pa.array([canonical_json({"A": int(i)}) for i in indices], pa.string())


CHECK = RecordCheck(total=100, run=RUN, expected_configs=configs_of)


def record(index: int, status: str = "ok", latency: float | None = 1.0, **kw) -> TrialRecord:
    outcome = TrialOutcome(status, "passed" if status == "ok" else "skipped",  # type: ignore
                           latency_ms=latency if status == "ok" else None,
                           error=None if status == "ok" else "boom")
    now = time.time()
    return TrialRecord.from_outcome(index, {"A": index}, outcome, where=Where("d", "n", "w1"),
                                    attempt=kw.get("attempt", 1), started_at=now,
                                    finished_at=now)


def test_journal_round_trips_records_sorted_by_index(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(3), record(1, "compile_error")], RUN)
        append_records(j, [record(2, latency=0.5)], RUN)
    table = read_journal(path, CHECK)[0]
    assert table.column("index").to_pylist() == [1, 2, 3]
    assert table.column("status").to_pylist() == ["compile_error", "ok", "ok"]
    assert json.loads(table.column("config")[0].as_py()) == {"A": 1}
    assert table.schema == RECORD_SCHEMA  # the run's fingerprint is checked, then dropped


def test_torn_last_line_is_ignored_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(0), record(1)], RUN)
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:37])  # a crash mid-write
    assert read_journal(path, CHECK)[0].column("index").to_pylist() == [0, 1]
    with Journal(path) as j:  # reopening cuts the torn bytes, so the next line starts clean
        append_records(j, [record(2)], RUN)
    assert read_journal(path, CHECK)[0].column("index").to_pylist() == [0, 1, 2]
    assert path.read_bytes().startswith(whole)


@pytest.mark.parametrize("cut", [1, 50, 120])
def test_journal_cut_at_any_byte_keeps_every_complete_record(tmp_path, cut):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i) for i in range(5)], RUN)
    raw = path.read_bytes()
    lines = raw.splitlines(keepends=True)
    cut_at = len(raw) - len(lines[-1]) + cut % len(lines[-1])
    path.write_bytes(raw[:cut_at])
    assert read_journal(path, CHECK)[0].column("index").to_pylist() == [0, 1, 2, 3]


def test_damage_before_the_last_line_is_reported_not_skipped(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i) for i in range(3)], RUN)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"index": 1, "sta\n' + lines[2])
    with pytest.raises(JournalError, match="line 2"):
        read_journal(path, CHECK)


def test_a_repeated_index_keeps_its_first_record(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(5, latency=2.0), record(4), record(5, latency=9.0)], RUN)
    table = read_journal(path, CHECK)[0]
    assert table.column("index").to_pylist() == [4, 5]
    assert table.column("latency_ms").to_pylist() == [1.0, 2.0]


def test_attempt_log_counts_deaths_and_the_highest_attempt(tmp_path):
    path = tmp_path / "a.jsonl"
    with Journal(path) as log:
        log.append([encode_attempt(7, 1, "died", RUN), encode_attempt(7, 2, "interrupted", RUN),
                    encode_attempt(3, 1, "died", RUN)])
    spent, deaths = read_attempts(path, CHECK)
    assert spent == {7: 2, 3: 1}
    assert deaths == {7: 1, 3: 1}


def test_record_refuses_an_unknown_status_and_clips_long_errors():
    with pytest.raises(ValueError, match="unknown status"):
        record(0, "exploded")
    outcome = TrialOutcome("runtime_error", "skipped", error="x" * 10_000)
    r = TrialRecord.from_outcome(0, {}, outcome, where=Where("d", "n", "w"), attempt=1,
                                 started_at=0.0, finished_at=0.0)
    assert len(r.error) == MAX_ERROR_CHARS and r.error.endswith("[truncated]")


def test_record_refuses_what_the_journal_reader_would_refuse():
    with pytest.raises(ValueError, match="only an ok trial has a latency"):
        TrialRecord.from_outcome(0, {}, TrialOutcome("timeout", "skipped", latency_ms=1.0),
                                 where=Where("d", "n", "w"), attempt=1,
                                 started_at=0.0, finished_at=0.0)
    with pytest.raises(ValueError, match="attempt 0 is below 1"):
        record(0, attempt=0)


def test_table_is_in_index_order_with_the_designed_columns(tmp_path):
    shuffled = [record(i, random.Random(i).choice(STATUSES)) for i in range(50)]
    random.Random(0).shuffle(shuffled)
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, shuffled, RUN)
    records = read_journal(path, CHECK)[0]
    params = {"A": pa.array(records.column("index").to_numpy())}
    table = build_table(records, params, {"fingerprint": "abc"})
    write_table(tmp_path / "t.parquet", table)
    back = pq.read_table(tmp_path / "t.parquet")
    assert back.column("index").to_pylist() == list(range(50))
    assert back.column("A").to_pylist() == list(range(50))
    assert [json.loads(c)["A"] for c in back.column("config").to_pylist()] == list(range(50))
    types_ = {f.name: str(f.type) for f in back.schema}
    assert types_ == {
        "index": "int64", "A": "int64", "config": "string", "status": "string",
        "latency_ms": "double", "latency_p20_ms": "double", "latency_p80_ms": "double",
        "validation": "string", "error": "string", "compile_ms": "double",
        "device": "string", "node": "string", "worker": "string", "attempt": "int32",
        "started_at": "timestamp[us, tz=UTC]", "finished_at": "timestamp[us, tz=UTC]"}
    assert back.schema.metadata[b"fingerprint"] == b"abc"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# Written out here rather than imported, so that the test checks the derivation.
_HINT_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), dict: pa.string()}


def _expected_journal_type(hint) -> pa.DataType:
    if get_origin(hint) is types.UnionType:
        (hint,) = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) is Literal:
        return pa.string()
    return _HINT_TYPES[get_origin(hint) or hint]


def test_the_record_dataclass_is_the_one_definition_of_the_columns(tmp_path):
    names = [f.name for f in fields(TrialRecord)]
    assert list(TABLE_COLUMNS) == names
    assert JOURNAL_SCHEMA.names == [*names, "run"]
    hints = get_type_hints(TrialRecord)
    assert [JOURNAL_SCHEMA.field(n).type for n in names] == \
        [_expected_journal_type(hints[n]) for n in names]
    assert set(TABLE_TYPES) < set(names)

    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i, STATUSES[i % len(STATUSES)]) for i in range(12)], RUN)
    records = read_journal(path, CHECK)[0]
    write_table(tmp_path / "t.parquet",
                build_table(records, {"P": pa.array(np.arange(12) * 2)}, {}))
    written = pq.read_table(tmp_path / "t.parquet").schema
    assert written.names == [names[0], "P", *names[1:]]
    assert [written.field(n).type for n in names] == \
        [TABLE_TYPES.get(n, JOURNAL_SCHEMA.field(n).type) for n in names]


def test_records_read_back_from_the_table_equal_those_it_was_built_from(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i, STATUSES[i % len(STATUSES)], attempt=1 + i % 3)
                           for i in range(30)], RUN)
    records = read_journal(path, CHECK)[0]
    write_table(tmp_path / "t.parquet",
                build_table(records, {"A": pa.array(np.arange(30))}, {"k": "v"}))
    back, meta = records_from_table(tmp_path / "t.parquet")
    assert meta == {"k": "v"}
    assert back.schema == RECORD_SCHEMA
    # Times go through whole microseconds in the table.
    rounded = records.set_column(
        records.schema.get_field_index("started_at"), "started_at",
        pa.array(np.round(records.column("started_at").to_numpy() * 1e6) / 1e6))
    rounded = rounded.set_column(
        rounded.schema.get_field_index("finished_at"), "finished_at",
        pa.array(np.round(records.column("finished_at").to_numpy() * 1e6) / 1e6))
    assert back.equals(rounded)


@pytest.mark.parametrize("hint, expected", [
    (int, (pa.int64(), False)), (float | None, (pa.float64(), True)),
    (str | None, (pa.string(), True)), (Literal["a", "b"], (pa.string(), False)),
    (dict[str, int], (pa.string(), False)),
])
def test_column_types_follow_the_field_type_hints(hint, expected):
    assert column_type(hint) == expected


@pytest.mark.parametrize("hint", [bool, list[int], int | str, bytes])
def test_a_field_type_without_a_column_type_is_refused(hint):
    with pytest.raises(TypeError, match="no column type"):
        column_type(hint)


def test_snapshot_round_trips_and_a_damaged_one_is_recognised(tmp_path):
    path = tmp_path / "snapshot.json"
    snap = Snapshot("running", "fp", 10, 4, {"ok": 4}, Best(2, {"A": 2}, 0.5, "d"))
    write_snapshot(path, snap)
    assert read_snapshot(path) == snap
    path.write_text(path.read_text().replace('"done": 4', '"done": 5'))
    with pytest.raises(SnapshotError, match="checksum"):
        read_snapshot(path)
    path.write_text(path.read_text()[:40])
    with pytest.raises(SnapshotError, match="unreadable"):
        read_snapshot(path)
