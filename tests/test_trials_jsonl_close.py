"""The end of a `--trials-jsonl` stream to a FIFO (sweep/observers.py): a reader that is
slow but alive gets every line at close, and what one that stops reading never took is
said in one line with its count. Real FIFOs, read by a real reader thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from storage.records import TrialRecord
from sweep.observers import TrialsJsonl
from sweep.results.tally import Tally

# Lines of about 200 KiB in all: past what a pipe holds (64 KiB), under MAX_PENDING.
COUNT = 800


def records(count: int) -> list[TrialRecord]:
    return [TrialRecord(index=i, config={"BLOCK": i, "pad": "x" * 100}, status="ok",
                        latency_ms=1.0, latency_p20_ms=1.0, latency_p80_ms=1.0,
                        validation="passed", error=None, compile_ms=None, device="d",
                        node="n", worker="w", attempt=1, started_at=0.0, finished_at=1.0)
            for i in range(count)]


def read_to_eof(fd: int, start: threading.Event, into: list[bytes]) -> None:
    """A slow reader: nothing until start, then small reads till the writer is gone."""
    start.wait()
    while chunk := os.read(fd, 512):
        into.append(chunk)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "trials.fifo"
    os.mkfifo(path)
    return path


def test_a_slow_reader_gets_every_line_written_before_close(fifo, monkeypatch):
    monkeypatch.setattr(TrialsJsonl, "WAIT_S", 600.0)  # the bound is not what is tested
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(reader, True)
    said: list[str] = []
    jsonl = TrialsJsonl(fifo, report=said.append)
    jsonl.on_records(records(COUNT), Tally(total=COUNT))
    assert said == []  # behind, not let go: the run goes on
    start, chunks = threading.Event(), []
    reading = threading.Thread(target=read_to_eof, args=(reader, start, chunks))
    reading.start()
    try:
        start.set()  # it reads only from here, as close() has the most left to write
        jsonl.close()
    finally:
        reading.join()
        os.close(reader)
    lines = b"".join(chunks).decode().splitlines()
    assert [int(line.split('"index": ')[1].split(",")[0]) for line in lines] == \
        list(range(COUNT))
    assert said == []


def test_the_lines_a_reader_that_stops_reading_never_took_are_counted_in_one_line(
        fifo, monkeypatch):
    monkeypatch.setattr(TrialsJsonl, "WAIT_S", 0.2)  # it never reads: any bound is missed
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    said: list[str] = []
    jsonl = TrialsJsonl(fifo, report=said.append)
    jsonl.on_records(records(COUNT), Tally(total=COUNT))
    jsonl.close()
    taken = b""
    while chunk := os.read(reader, 1 << 16):  # what the pipe held, then the EOF
        taken += chunk
    os.close(reader)
    lost = COUNT - taken.count(b"\n")
    assert lost > 0
    assert said == [f"trials JSONL {fifo}: its reader did not take the last {lost} lines; "
                    "they are not written there (the journal holds every trial)"]


def test_a_stop_asked_for_while_close_waits_ends_the_wait(fifo, monkeypatch):
    monkeypatch.setattr(TrialsJsonl, "WAIT_S", 3600.0)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open, never read
    said: list[str] = []
    jsonl = TrialsJsonl(fifo, report=said.append)
    jsonl.on_records(records(COUNT), Tally(total=COUNT))
    asked = iter([False, False, True])  # none before close, then one while it waits
    closing = threading.Thread(target=jsonl.close, args=(lambda: next(asked, True),))
    closing.start()
    closing.join(120)  # a hang fails here instead of holding the suite for an hour
    os.close(reader)
    assert not closing.is_alive()
    assert len(said) == 1 and "its reader did not take the last" in said[0]
