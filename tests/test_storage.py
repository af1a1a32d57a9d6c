"""The journal, the trial record and the Parquet table: what survives a crash."""

import json
import random
import time

import pyarrow.parquet as pq
import pytest

from storage.journal import (
    Journal,
    JournalError,
    append_records,
    encode_attempt,
    read_attempts,
    read_journal,
)
from storage.records import MAX_ERROR_CHARS, STATUSES, TrialOutcome, TrialRecord
from storage.snapshot import Best, Snapshot, SnapshotError, read_snapshot, write_snapshot
from storage.table import build_table, write_table
from sweep.space import expand


def record(index: int, status: str = "ok", latency: float | None = 1.0, **kw) -> TrialRecord:
    outcome = TrialOutcome(status, "passed" if status == "ok" else "skipped",  # type: ignore
                           latency_ms=latency if status == "ok" else None,
                           error=None if status == "ok" else "boom")
    now = time.time()
    return TrialRecord.from_outcome(index, {"A": index}, outcome, device="d", node="n",
                                    worker="w1", attempt=kw.get("attempt", 1),
                                    started_at=now, finished_at=now)


def test_journal_round_trips_records_sorted_by_index(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(3), record(1, "compile_error")])
        append_records(j, [record(2, latency=0.5)])
    table = read_journal(path)[0]
    assert table.column("index").to_pylist() == [1, 2, 3]
    assert table.column("status").to_pylist() == ["compile_error", "ok", "ok"]
    assert json.loads(table.column("config")[0].as_py()) == {"A": 1}


def test_torn_last_line_is_ignored_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(0), record(1)])
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:37])  # a crash mid-write
    assert read_journal(path)[0].column("index").to_pylist() == [0, 1]
    with Journal(path) as j:  # reopening cuts the torn bytes, so the next line starts clean
        append_records(j, [record(2)])
    assert read_journal(path)[0].column("index").to_pylist() == [0, 1, 2]
    assert path.read_bytes().startswith(whole)


@pytest.mark.parametrize("cut", [1, 50, 120])
def test_journal_cut_at_any_byte_keeps_every_complete_record(tmp_path, cut):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i) for i in range(5)])
    raw = path.read_bytes()
    lines = raw.splitlines(keepends=True)
    cut_at = len(raw) - len(lines[-1]) + cut % len(lines[-1])
    path.write_bytes(raw[:cut_at])
    assert read_journal(path)[0].column("index").to_pylist() == [0, 1, 2, 3]


def test_damage_before_the_last_line_is_reported_not_skipped(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i) for i in range(3)])
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"index": 1, "sta\n' + lines[2])
    with pytest.raises(JournalError, match="line 2"):
        read_journal(path)[0]


def test_a_repeated_index_keeps_its_first_record(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(5, latency=2.0), record(4), record(5, latency=9.0)])
    table = read_journal(path)[0]
    assert table.column("index").to_pylist() == [4, 5]
    assert table.column("latency_ms").to_pylist() == [1.0, 2.0]


def test_attempt_log_counts_deaths_and_the_highest_attempt(tmp_path):
    path = tmp_path / "a.jsonl"
    with Journal(path) as log:
        log.append([encode_attempt(7, 1, "died"), encode_attempt(7, 2, "interrupted"),
                    encode_attempt(3, 1, "died")])
    spent, deaths = read_attempts(path)
    assert spent == {7: 2, 3: 1}
    assert deaths == {7: 1, 3: 1}


def test_record_refuses_an_unknown_status_and_clips_long_errors():
    with pytest.raises(ValueError, match="unknown status"):
        record(0, "exploded")
    outcome = TrialOutcome("runtime_error", "skipped", error="x" * 10_000)
    r = TrialRecord.from_outcome(0, {}, outcome, device="d", node="n", worker="w", attempt=1,
                                 started_at=0.0, finished_at=0.0)
    assert len(r.error) == MAX_ERROR_CHARS and r.error.endswith("[truncated]")


def test_table_is_in_index_order_with_the_designed_columns(tmp_path):
    space = expand({"A": list(range(50))}, [])
    shuffled = [record(i, random.Random(i).choice(STATUSES)) for i in range(50)]
    random.Random(0).shuffle(shuffled)
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, shuffled)
    records = read_journal(path)[0]
    table = build_table(records, space.arrow_columns(records.column("index").to_numpy()),
                        {"fingerprint": "abc"})
    write_table(tmp_path / "t.parquet", table)
    back = pq.read_table(tmp_path / "t.parquet")
    assert back.column("index").to_pylist() == list(range(50))
    assert back.column("A").to_pylist() == list(range(50))
    assert [json.loads(c)["A"] for c in back.column("config").to_pylist()] == list(range(50))
    types = {f.name: str(f.type) for f in back.schema}
    assert types == {
        "index": "int64", "A": "int64", "config": "string", "status": "string",
        "latency_ms": "double", "latency_p20_ms": "double", "latency_p80_ms": "double",
        "validation": "string", "error": "string", "compile_ms": "double",
        "device": "string", "node": "string", "worker": "string", "attempt": "int32",
        "started_at": "timestamp[us, tz=UTC]", "finished_at": "timestamp[us, tz=UTC]"}
    assert back.schema.metadata[b"fingerprint"] == b"abc"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


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
