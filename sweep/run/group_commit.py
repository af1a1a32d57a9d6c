"""Group commit of finished trials: the records and spent attempts gathered while the
driver's loop runs are made durable in one write (its fsync most of all) on a thread of
their own, overlapping the loop, and count only once durable."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from storage.records import TrialRecord
from sweep.run.contracts import SpentAttempt, TrialLog

COMMIT_EVERY_S = 0.02  # the longest a finished trial waits for its durable write


class GroupCommit:
    def __init__(self) -> None:
        self.records: list[TrialRecord] = []
        self.lines: list[bytes | None] = []  # each record's journal line, where encoded
        self.attempts: list[SpentAttempt] = []
        self.writing: Future[list[TrialRecord]] | None = None  # a group being made durable
        self._writer: ThreadPoolExecutor | None = None

    def add(self, record: TrialRecord, line: bytes | None = None) -> None:
        self.records.append(record)
        self.lines.append(line)

    @property
    def pending(self) -> bool:
        """Records not counted yet: waiting for their write, or being written."""
        return self.writing is not None or bool(self.records)

    def commit(self, log: TrialLog, final: bool = False) -> Iterator[list[TrialRecord]]:
        """The groups written to log and now durable, in the order they are to count.
        Pipelined: a group's write runs on the thread while the loop goes on, and is handed
        over once durable, when the next group is; with final, everything is written and
        handed over before the iteration ends. A failed write raises here."""
        group = bool(self.records or self.attempts)
        if self.writing is not None and (final or group or self.writing.done()):
            # Taken off only once durable: a KeyboardInterrupt while waiting (an API
            # caller's second Ctrl+C) leaves it for close() to count.
            written = self.writing.result()
            self.writing = None
            yield written
        if not group:
            return
        records, attempts, lines = self.records, self.attempts, self.lines
        self.records, self.attempts, self.lines = [], [], []
        if final:
            log.commit(records, attempts, lines)
            yield records
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="journal")

        def write() -> list[TrialRecord]:
            log.commit(records, attempts, lines)
            return records

        self.writing = self._writer.submit(write)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None
