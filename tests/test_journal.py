"""The journal under hostile conditions: writes that fail or fall short, a full disk, and
lines that are well-typed lies, malformed, or from another run."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import tmpfs

import storage.journal as journal_module
import storage.journal_file as journal_file
from storage.atomic import write_bytes_atomically
from storage.journal import (
    Journal,
    JournalError,
    RecordCheck,
    append_records,
    read_attempts,
    read_journal,
)
from storage.journal_file import JournalWriteError, line_mark
from storage.lines import encode, encode_attempt
from storage.records import TrialOutcome, TrialRecord, Where, canonical_json

RUN = "0123456789abcdef"
OTHER_RUN = "fedcba9876543210"
TOTAL = 10


def configs_of(indices: np.ndarray) -> pa.Array:
    return pa.array([canonical_json({"A": int(i)}) for i in indices], pa.string())


CHECK = RecordCheck(total=TOTAL, run=RUN, expected_configs=configs_of)


def record(index: int, status: str = "ok") -> TrialRecord:
    outcome = TrialOutcome(status, "passed" if status == "ok" else "skipped",  # type: ignore
                           latency_ms=1.0 + index if status == "ok" else None,
                           error=None if status == "ok" else "boom")
    return TrialRecord.from_outcome(index, {"A": index}, outcome, where=Where("d", "n", "w1"),
                                    attempt=1, started_at=1.7e9 + index,
                                    finished_at=1.7e9 + index + 0.5)


def indices(path: Path, check: RecordCheck = CHECK) -> list[int]:
    return read_journal(path, check)[0].column("index").to_pylist()


# -- appending: short writes, failed writes, a full disk -------------------------------

def faulty_write(fd_of: Callable[[], int], *, chunk: int | None = None,
                 fail_after: int | None = None,
                 error: BaseException | None = None) -> Callable[[int, bytes], int]:
    """A stand-in for os.write on the journal's descriptor: writes at most `chunk` bytes a
    call, and after `fail_after` bytes in all raises `error` (ENOSPC unless given)."""
    real = os.write
    state = {"written": 0}

    def write(fd: int, data: bytes) -> int:
        if fd != fd_of():
            return real(fd, data)
        data = bytes(data)
        if chunk is not None:
            data = data[:chunk]
        if fail_after is not None:
            room = fail_after - state["written"]
            if room <= 0:
                raise error or OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = data[:room]
        n = real(fd, data)
        state["written"] += n
        return n

    return write


def test_short_writes_are_continued_until_the_whole_group_is_written(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        monkeypatch.setattr(journal_file.os, "write",
                            faulty_write(lambda: j._fd, chunk=97))
        written = append_records(j, [record(i) for i in range(6)], RUN)
    monkeypatch.undo()
    assert written == path.stat().st_size
    assert path.read_bytes() == b"".join(encode(record(i), RUN) for i in range(6))
    assert indices(path) == list(range(6))


@pytest.mark.parametrize("fail_after", [0, 1, 200, "one line", "two lines and a bit"])
def test_a_write_that_fails_midway_is_cut_back_and_raises(tmp_path, monkeypatch, fail_after):
    path = tmp_path / "j.jsonl"
    line = len(encode(record(3), RUN))
    fail_at = {"one line": line, "two lines and a bit": 2 * line + 17}.get(fail_after,
                                                                          fail_after)
    with Journal(path) as j:
        append_records(j, [record(0), record(1)], RUN)
        before = path.read_bytes()
        monkeypatch.setattr(journal_file.os, "write",
                            faulty_write(lambda: j._fd, chunk=150, fail_after=fail_at))
        with pytest.raises(JournalWriteError) as caught:
            append_records(j, [record(3), record(4), record(5)], RUN)
        monkeypatch.undo()
        assert path.read_bytes() == before  # nothing of the failed group, torn or whole
        append_records(j, [record(6)], RUN)  # space is back: the next append follows cleanly
    e = caught.value
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename == str(path)
    assert str(e) == f"{path}: no space left on device (3 records not written)"
    assert indices(path) == [0, 1, 6]


def test_a_failed_fsync_cuts_the_group_back(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    real_fsync = os.fsync
    with Journal(path) as j:
        append_records(j, [record(0)], RUN)

        def fsync(fd: int) -> None:
            monkeypatch.setattr(journal_file.os, "fsync", real_fsync)  # fails just once
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(journal_file.os, "fsync", fsync)
        with pytest.raises(JournalWriteError, match=r"input/output error \(2 records") as e:
            append_records(j, [record(1), record(2)], RUN)
        assert e.value.errno == errno.EIO
    assert indices(path) == [0]


def test_an_interrupt_mid_write_cuts_the_group_back_and_propagates(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(0)], RUN)
        monkeypatch.setattr(journal_file.os, "write", faulty_write(
            lambda: j._fd, chunk=50, fail_after=120, error=KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            append_records(j, [record(1), record(2)], RUN)
    assert path.read_bytes() == encode(record(0), RUN)


def test_appends_are_refused_after_a_failed_group_could_not_be_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        monkeypatch.setattr(journal_file.os, "write",
                            faulty_write(lambda: j._fd, fail_after=30))

        def ftruncate(fd: int, length: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(journal_file.os, "ftruncate", ftruncate)
        with pytest.raises(JournalWriteError, match="no space left"):
            append_records(j, [record(0)], RUN)
        monkeypatch.undo()
        # The torn bytes are still there: an append now would bury them mid-journal.
        with pytest.raises(JournalWriteError, match="could not be cut off; reopen"):
            append_records(j, [record(1)], RUN)
    with Journal(path) as j:  # reopening cuts the torn tail
        append_records(j, [record(1)], RUN)
    assert indices(path) == [1]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a real disk that fills up."""
    with tmpfs(tmp_path / "disk", "64k") as disk:
        yield disk


def test_a_full_disk_leaves_whole_lines_only_and_appends_resume_when_space_is_back(tiny_disk):
    filler = tiny_disk / "filler"
    filler.write_bytes(b"x" * 16 * 1024)
    path = tiny_disk / "j.jsonl"
    acknowledged: list[int] = []
    failed: list[int] = []
    with Journal(path) as j:
        for start in range(0, 10_000, 7):
            group = [record(i % TOTAL) for i in range(start, start + 7)]
            try:
                append_records(j, group, RUN)
            except JournalWriteError as e:
                assert e.errno == errno.ENOSPC and "7 records not written" in str(e)
                failed = list(range(start, start + 7))
                break
            acknowledged.extend(range(start, start + 7))
        assert failed, "the disk never filled up"
        raw = path.read_bytes()
        assert raw.endswith(b"\n")
        assert raw == b"".join(encode(record(i % TOTAL), RUN) for i in acknowledged)
        assert len(read_journal(path, CHECK)[0]) == min(TOTAL, len(acknowledged))
        filler.unlink()
        append_records(j, [record(i % TOTAL) for i in failed], RUN)
    raw = path.read_bytes()
    assert raw == b"".join(encode(record(i % TOTAL), RUN) for i in acknowledged + failed)
    assert indices(path) == list(range(TOTAL))


def test_an_atomic_replace_on_a_full_disk_keeps_the_old_file_and_no_temp_file(tiny_disk):
    path = tiny_disk / "snapshot.json"
    write_bytes_atomically(path, b"old contents")
    with pytest.raises(OSError) as caught:
        write_bytes_atomically(path, b"y" * 128 * 1024)
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["snapshot.json"]
    write_bytes_atomically(path, b"new contents")  # the failed attempt freed its space
    assert path.read_bytes() == b"new contents"


# -- reading: every complete line must be a record of this run -------------------------

def good_line(index: int = 5, status: str = "ok") -> dict:
    return json.loads(encode(record(index, status), RUN))


def compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def with_(**changes: object) -> bytes:
    return compact({**good_line(), **changes})


def without(*keys: str) -> bytes:
    return compact({k: v for k, v in good_line().items() if k not in keys})


def with_raw(key: str, text: bytes) -> bytes:
    """A good line whose `key` holds `text` verbatim: what json.dumps would not write."""
    return with_(**{key: "@@"}).replace(b'"@@"', text)


LIES: dict[str, tuple[bytes, str]] = {
    "negative index": (with_(index=-1), r"index -1 is outside 0\.\.9"),
    "index past the end": (with_(index=TOTAL), r"index 10 is outside 0\.\.9"),
    "index as a string": (with_(index="5"), "index: expected a 64-bit integer, got a string"),
    "index as a float": (with_(index=5.0), "index: expected a 64-bit integer, got a number"),
    "index too big for int64": (with_(index=2**64), "index: expected a 64-bit integer"),
    "attempt as a bool": (with_(attempt=True), "attempt: expected a 64-bit integer, got a bool"),
    "an error too long": (with_(status="runtime_error", latency_ms=None, error="e" * 2049),
                          "error is longer than 2048 characters"),
    "attempt 0": (with_(attempt=0), "attempt 0 is below 1"),
    "attempt beyond the table's int32": (with_(attempt=2**40), "attempt .* outside the table"),
    "another run's line": (with_(run=OTHER_RUN), f"written by another run .*{OTHER_RUN}"),
    "no run": (without("run"), "lacks run|run is missing"),
    "a bare index and status": (compact({"index": 5, "status": "ok"}), "lacks config"),
    "empty object": (b"{}", "lacks index"),
    "missing nullable key": (without("error"), "lacks error"),
    "missing latency_p20_ms": (without("latency_p20_ms"), "lacks latency_p20_ms"),
    "unknown key": (with_(extra=1), "has unknown keys extra"),
    "repeated key": (with_()[:-1] + b',"index":5}', "key 'index' appears twice"),
    "config of another index": (with_(config=canonical_json({"A": 4})),
                                r'config \{"A":4\} is not config 5, \{"A":5\}'),
    "config missing": (with_(config=None), "config is (missing or )?null"),
    "unknown status": (with_(status="exploded"), "unknown status 'exploded'"),
    "unknown validation": (with_(validation="maybe"), "unknown validation 'maybe'"),
    "ok without latency": (with_(latency_ms=None), "status ok without latency_ms"),
    "latency for a failure": (compact({**good_line(5, "compile_error"), "latency_ms": 1.0}),
                              "latency_ms given for status 'compile_error'"),
    "device null": (with_(device=None), "device is (missing or )?null"),
    "worker a number": (with_(worker=7), "worker: expected a string, got an integer"),
    "started_at NaN": (with_raw("started_at", b"NaN"),
                       "started_at nan is not finite|NaN is not a JSON number"),
    "finished_at huge": (with_(finished_at=1e300), "finished_at .* outside the table's range"),
    "not JSON": (b'{"index": 1, "sta', "not JSON"),
    "null": (b"null", "not a JSON object but null"),
    "padded null": (b"  null  ", "not a JSON object but null"),
    "an array": (b"[1,2]", "not a JSON object but an array"),
    "blank": (b"", "not JSON"),
    "two records on a line": (with_() + with_(index=6), "not JSON .*Extra data"),
    "a record over two lines": (with_().replace(b',"status"', b',\n"status"'), "not JSON"),
    "not UTF-8": (with_raw("error", b'"\xff"'), "not UTF-8"),
    "an index of 5,000 digits": (with_raw("index", b"9" * 5000), "not a JSON value"),
    "200,000 nested brackets": (with_raw("error", b"[" * 200_000 + b"]" * 200_000),
                                "nested too deeply"),
    "an escaped lone surrogate": (with_(status="runtime_error", latency_ms=None,
                                        error="\udcff"), "holds a lone surrogate"),
    "a lone surrogate's bytes": (with_raw("error", b'"\xed\xb3\xbf"'),
                                 "holds a lone surrogate|not UTF-8"),
    "a negative latency": (with_(latency_ms=-1.0), "latency_ms -1.0 is negative"),
    "a negative compile time": (with_(compile_ms=-5.0), "compile_ms -5.0 is negative"),
}


@pytest.mark.parametrize("where", ["first line", "between good lines", "last complete line"])
@pytest.mark.parametrize("lie", list(LIES))
def test_a_line_that_is_not_a_record_of_this_run_is_named(tmp_path, lie, where):
    line, problem = LIES[lie]
    good = [encode(record(i), RUN) for i in range(3)]
    torn = good[2][:20]
    path = tmp_path / "j.jsonl"
    if where == "first line":  # where pyarrow's reader begins a block
        path.write_bytes(line + b"\n" + good[0] + torn)
    else:
        after = good[2] if where == "between good lines" else b""
        path.write_bytes(good[0] + good[1] + line + b"\n" + after + torn)
    number = 1 if where == "first line" else 3
    with pytest.raises(JournalError,
                       match=rf"^{re.escape(str(path))}: line {number}: ({problem})"):
        read_journal(path, CHECK)


def test_the_line_the_lies_are_made_from_is_read(tmp_path):
    """So each lie above is refused for what was changed in it."""
    good = [encode(record(i), RUN) for i in range(3)]
    path = tmp_path / "j.jsonl"
    path.write_bytes(good[0] + good[1] + with_() + b"\n" + good[2])
    assert indices(path) == [0, 1, 2, 5]


def test_the_first_bad_line_is_named_even_when_a_later_one_is_malformed(tmp_path):
    good = [encode(record(i), RUN) for i in range(4)]
    path = tmp_path / "j.jsonl"
    path.write_bytes(good[0] + with_(index=-1) + b"\n" + good[1] + b"{oops\n" + good[2])
    with pytest.raises(JournalError, match="line 2: index -1"):
        read_journal(path, CHECK)


def test_line_numbers_count_from_the_start_of_the_file_when_reading_from_an_offset(tmp_path):
    good = [encode(record(i), RUN) for i in range(5)]
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(good[:3]) + with_(status="exploded") + b"\n" + good[4])
    start = len(b"".join(good[:2]))
    with pytest.raises(JournalError, match="line 4: unknown status"):
        read_journal(path, CHECK, start=start)


def test_reading_from_an_offset_that_does_not_begin_a_line_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(encode(record(i), RUN) for i in range(3)))
    with pytest.raises(JournalError, match="byte 7 does not begin a line"):
        read_journal(path, CHECK, start=7)
    with pytest.raises(JournalError, match="fewer than the"):
        read_journal(path, CHECK, start=path.stat().st_size + 1)


def test_a_row_of_the_table_read_before_is_checked_and_named_as_such(tmp_path):
    path = tmp_path / "j.jsonl"
    good = [encode(record(i), RUN) for i in range(4)]
    path.write_bytes(b"".join(good))
    start = len(good[0] + good[1])
    before = read_journal(path, CHECK)[0].slice(0, 2)
    table, end = read_journal(path, CHECK, start, before)
    assert table.column("index").to_pylist() == [0, 1, 2, 3] and end == path.stat().st_size
    lying = before.set_column(0, "index", pa.array([0, 12]))
    with pytest.raises(JournalError, match=r"the table read before byte \d+, row 2: index 12"):
        read_journal(path, CHECK, start, lying)


def test_a_journal_written_with_other_spacing_reads_like_the_compact_one(tmp_path):
    compact_path, spaced_path = tmp_path / "compact.jsonl", tmp_path / "spaced.jsonl"
    records = [record(i, "ok" if i % 3 else "runtime_error") for i in (4, 1, 7, 1)]
    compact_path.write_bytes(b"".join(encode(r, RUN) for r in records))
    spaced_path.write_bytes(b"".join(
        (json.dumps(json.loads(encode(r, RUN)), indent=None) + " \r\n").encode()
        for r in records))
    fast, fast_end = read_journal(compact_path, CHECK)
    slow, slow_end = read_journal(spaced_path, CHECK)
    assert fast.equals(slow) and fast.column("index").to_pylist() == [1, 4, 7]
    assert (fast_end, slow_end) == (compact_path.stat().st_size, spaced_path.stat().st_size)


def test_a_journal_as_encode_writes_it_never_takes_the_line_by_line_path(tmp_path, monkeypatch):
    """The line-by-line path is ~10x slower: a resume of a million trials must not take it."""
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        append_records(j, [record(i, "ok" if i % 2 else "crashed") for i in range(TOTAL)], RUN)

    def line_by_line(line: bytes) -> dict:
        raise AssertionError("took the line-by-line path")

    monkeypatch.setattr(journal_module, "_parse_record", line_by_line)
    assert indices(path) == list(range(TOTAL))


def test_a_check_refuses_a_fingerprint_that_is_not_one():
    with pytest.raises(ValueError, match="16 lowercase hex digits"):
        RecordCheck(total=1, run="abc", expected_configs=configs_of)
    with pytest.raises(ValueError, match="16 lowercase hex digits"):
        encode(record(0), RUN.upper())


# -- the attempt log -------------------------------------------------------------------

@pytest.mark.parametrize("line, problem", [
    (b'{"index":12,"attempt":1,"event":"died","run":"%s"}' % RUN.encode(), "index 12"),
    (b'{"index":"3","attempt":1,"event":"died","run":"%s"}' % RUN.encode(), 'index "3"'),
    (b'{"index":3,"attempt":0,"event":"died","run":"%s"}' % RUN.encode(), "attempt 0"),
    (b'{"index":3,"attempt":1,"event":"vanished","run":"%s"}' % RUN.encode(),
     'unknown event "vanished"'),
    (encode_attempt(3, 1, "died", OTHER_RUN).rstrip(), "written by another run"),
    (b'{"index":3,"attempt":1,"event":"died"}', "lacks run"),
    (b"{oops", "not JSON"),
    (b'{"index":%s,"attempt":1,"event":"died","run":"%s"}' % (b"9" * 5000, RUN.encode()),
     "not a JSON value"),
    (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    (b'{"index":3,"attempt":1,"event":"died","run":"%s","why":"\\udcff"}' % RUN.encode(),
     "holds a lone surrogate"),
])
@pytest.mark.parametrize("last", [False, True])
def test_a_bad_line_of_the_attempt_log_is_named(tmp_path, line, problem, last):
    path = tmp_path / "a.jsonl"
    good = encode_attempt(3, 1, "died", RUN)
    path.write_bytes(good + line + b"\n" + (b"" if last else good) + b'{"index":')
    with pytest.raises(JournalError, match=f"^{re.escape(str(path))}: line 2: {problem}"):
        read_attempts(path, CHECK)


def test_the_torn_tail_of_the_attempt_log_is_ignored(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(encode_attempt(3, 2, "interrupted", RUN) + b'{"index":-1,"att')
    assert read_attempts(path, CHECK) == ({3: 2}, {})


# -- marking where the table left off --------------------------------------------------

def test_a_line_mark_identifies_the_line_ending_at_an_offset(tmp_path):
    path = tmp_path / "j.jsonl"
    lines = [encode(record(i), RUN) for i in range(3)]
    path.write_bytes(b"".join(lines) + b'{"torn')
    end = len(lines[0] + lines[1])
    assert line_mark(path, end) == hashlib.sha256(lines[1]).hexdigest()[:16]
    assert line_mark(path, len(lines[0])) == hashlib.sha256(lines[0]).hexdigest()[:16]
    assert line_mark(path, end) != line_mark(path, end + len(lines[2]))
    for nowhere in (0, end - 1, end + 1, path.stat().st_size, path.stat().st_size + 10):
        assert line_mark(path, nowhere) is None
    assert line_mark(tmp_path / "absent.jsonl", end) is None

    other = tmp_path / "other.jsonl"  # as long, but not the same journal
    other.write_bytes(lines[0] + lines[1].replace(b'"w1"', b'"w2"'))
    assert other.stat().st_size == end and line_mark(other, end) != line_mark(path, end)


def test_a_line_mark_reads_only_near_the_offset(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    long_line = b'{"error":"' + b"e" * 200_000 + b'"}\n'
    with Journal(path) as j:
        j.append([encode(record(i % TOTAL), RUN) for i in range(5000)] + [long_line])
    size = path.stat().st_size
    read: list[int] = []
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        read.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(journal_file.os, "pread", pread)
    assert line_mark(path, size) == hashlib.sha256(long_line).hexdigest()[:16]
    assert sum(read) < len(long_line) + 2 * journal_file._CHUNK < size // 4



def test_a_journal_read_in_blocks_reads_as_a_whole_and_names_lines_from_the_start(
        tmp_path, monkeypatch):
    lines = [encode(record(i), RUN) for i in range(TOTAL)]
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(lines) + lines[0][:20])  # and a torn tail
    whole, end = read_journal(path, CHECK)
    # Blocks smaller than a line, and ones that hold a few lines and part of another.
    for block in (100, len(lines[0]) * 3 + 7):
        monkeypatch.setattr(journal_module, "PARSE_BLOCK", block)
        table, block_end = read_journal(path, CHECK)
        assert table.equals(whole) and block_end == end == len(b"".join(lines))
    bad = [*lines[:6], with_(status="exploded") + b"\n", *lines[7:]]
    path.write_bytes(b"".join(bad))
    with pytest.raises(JournalError, match="line 7: unknown status"):
        read_journal(path, CHECK)


RUN = "0123456789abcdef"  # a run's fingerprint


class Lines:
    """A LineLog in memory: what was appended, in order, into one shared list."""

    def __init__(self, name: str, written: list, fail: bool = False) -> None:
        self.name, self.written, self.fail = name, written, fail

    def append(self, lines):
        if self.fail:
            raise JournalWriteError(errno.ENOSPC, "no space left on device")
        group = list(lines)
        self.written += [(self.name, line) for line in group]
        return sum(map(len, group))

    def close(self) -> None:
        pass


def test_the_run_log_writes_spent_attempts_before_the_records_each_marked_as_the_runs():
    from sweep.run.contracts import SpentAttempt
    from sweep.run.rundir import RunLog

    written: list = []
    log = RunLog(Lines("journal", written), Lines("attempts", written), RUN)
    given = encode(record(1), RUN)  # a worker's own encoding goes in as it came
    log.commit([record(0), record(1)], [SpentAttempt(2, 1, "died", "SIGKILL")], [None, given])
    assert written == [("attempts", encode_attempt(2, 1, "died", RUN, "SIGKILL")),
                       ("journal", encode(record(0), RUN)), ("journal", given)]


def test_records_whose_spent_attempts_were_not_written_are_not_written_either():
    from sweep.run.contracts import SpentAttempt
    from sweep.run.rundir import RunLog

    written: list = []
    log = RunLog(Lines("journal", written), Lines("attempts", written, fail=True), RUN)
    with pytest.raises(JournalWriteError):
        log.commit([record(0)], [SpentAttempt(0, 1, "interrupted")], [None])
    assert written == []  # a record never counts ahead of the attempts it spent
