"""Observers a user attaches to a run: a callable told of each finished trial (the Python
API's `on_trial`), and a JSON Lines stream of the same records (`--trials-jsonl PATH`).

Both are driver Observers (see sweep.run.driver.Observer): called on the driver's thread, in
completion order, once a trial's record is durable in the journal. A user's observer
must not be able to change the sweep: one that raises is reported once and not called
again.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storage.records import TrialRecord
from sweep.results.tally import Tally


class ObserverWarning(RuntimeWarning):
    """An observer failed and was disabled; the sweep went on unchanged."""


def warn(message: str) -> None:
    """How the Python API reports an observer's failure (the CLI prints one line). Under
    warnings-as-errors (pytest's filterwarnings = error, -W error) it still must not end
    the sweep: the message goes to stderr instead."""
    try:
        warnings.warn(message, ObserverWarning, stacklevel=3)
    except Warning:
        sys.stderr.write(f"{ObserverWarning.__name__}: {message}\n")


def trial_json(record: TrialRecord) -> dict[str, Any]:
    """A record as JSON-compatible values (times: seconds since the epoch, UTC)."""
    out = record.to_json()
    out["config"] = dict(record.config)
    return out


class TrialCallback:
    """on_trial(record) for each finished trial, until it raises."""

    def __init__(self, on_trial: Callable[[dict[str, Any]], object],
                 report: Callable[[str], None] = warn) -> None:
        self._call: Callable[[dict[str, Any]], object] | None = on_trial
        self._report = report

    def on_records(self, records: list[TrialRecord], tally: Tally) -> None:
        for record in records:
            if self._call is None:
                return
            try:
                self._call(trial_json(record))
            except Exception as e:  # the user's code: it must not end the sweep
                name = getattr(self._call, "__qualname__", type(self._call).__name__)
                self._call = None
                self._report(f"on_trial observer {name} raised {type(e).__name__}: "
                             f"{str(e)[:300]} (trial #{record.index}); it is not called "
                             "again in this run, which goes on")

    def on_event(self, message: str) -> None:
        pass

    def close(self, stopping: Callable[[], bool] = lambda: False) -> None:
        pass


class TrialsJsonl:
    """Appends each finished trial to a file as one JSON line, written per group (a
    `tail -f` sees trials as they finish). The run's own record is the journal: a write
    that fails here (a full disk) is reported once and the stream ends there.

    The sweep never waits for a reader while it runs: to a FIFO or pipe the lines are
    written without blocking, and what its reader has not taken yet waits here, up to
    MAX_PENDING bytes; a reader that falls further behind is let go (said once; the run
    goes on). At close a slow reader is waited for, up to WAIT_S seconds: what it has not
    taken by then is let go, and how many lines that was is said."""

    MAX_PENDING = 256 * 1024
    WAIT_S = 5.0

    def __init__(self, path: Path, report: Callable[[str], None] = warn) -> None:
        """Raises OSError for a path that cannot be written; creates nothing until the
        first trial (a run refused for bad input leaves no file behind)."""
        where = path.parent
        if path.is_dir() or not where.is_dir() or not os.access(where, os.W_OK) or (
                path.exists() and not os.access(path, os.W_OK)):
            raise OSError("not a file in a writable directory")
        self.path = path
        self._report = report
        self._fd: int | None = None
        self._pending = b""  # written lines a reader has not taken yet
        self._closed = False
        if path.is_fifo():  # its open would wait for a reader, the sweep with it; kept
            # open from here: closing it would end a reader such as `cat` (its EOF)
            self._fd = _open_append(path)

    def on_records(self, records: list[TrialRecord], tally: Tally) -> None:
        if self._closed:
            return
        try:
            if self._fd is None:
                self._fd = _open_append(self.path)
            self._pending += "".join(json.dumps(trial_json(r), ensure_ascii=False) + "\n"
                                     for r in records).encode()
            self._write()
        except OSError as e:
            self._end()
            self._report(f"trials JSONL {self.path}: {e.strerror or e}; no more trials are "
                         "written there (the run goes on)")
            return
        if len(self._pending) > self.MAX_PENDING:
            self._end()
            self._report(f"trials JSONL {self.path}: its reader has stopped reading; no "
                         "more trials are written there (the run goes on)")

    def _write(self) -> None:
        """As much of what is pending as the file takes now (a full pipe: none)."""
        assert self._fd is not None
        while self._pending:
            try:
                written = os.write(self._fd, self._pending)
            except BlockingIOError:
                return
            self._pending = self._pending[written:]

    def on_event(self, message: str) -> None:
        pass

    def close(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """The stream ends, once its reader has taken what is pending or WAIT_S seconds
        have passed, or a stop is asked for (stopping() turns true) in the meantime: the
        user wants out. A stop asked for before does not cut the wait short: that stop
        ended the run and waited for its trials, whose lines these are."""
        if self._closed or self._fd is None:
            self._end()
            return
        asked_before = stopping()
        deadline = time.monotonic() + self.WAIT_S
        writable = select.poll()
        writable.register(self._fd, select.POLLOUT)
        try:
            self._write()
            while self._pending and not (stopping() and not asked_before):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # In slices, to see a stop asked for; a reader gone wakes it (POLLERR), and
                # the write then fails.
                writable.poll(min(left, 0.1) * 1000)
                self._write()
        except OSError:
            pass  # its reader is gone: what is left is let go, below
        finally:
            lost = self._pending.count(b"\n")
            self._end()
            if lost:
                self._report(f"trials JSONL {self.path}: its reader did not take the last "
                             f"{lost} line{'s' if lost != 1 else ''}; they are not written "
                             "there (the journal holds every trial)")

    def _end(self) -> None:
        """Closes the file at once; what is pending is let go."""
        self._closed = True
        self._pending = b""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _open_append(path: Path) -> int:
    """For appending, never waiting: a FIFO nobody reads is refused at once (ENXIO),
    where a plain open would block until a reader came, and a write to a full one fails at
    once (EAGAIN) instead of waiting for its reader."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK |
                     os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO no process reads; start its reader "
                                       "first") from None
        raise
    return fd
