"""The journal's file as bytes: lines appended durably, complete lines read back. Apart from
what the lines mean (storage/journal.py), so the rules of a record never touch fsync.

An append is fsync'd before it returns (group commit: the driver appends what arrived over a
few milliseconds at once), and one that fails (a full disk, an I/O error) is cut back off
the file, so nothing of it counts and later appends follow a clean line. A crash can tear
only the last line, which carries no newline yet: reading leaves it out and opening for
append cuts it off. The attempt log is a file of the same kind.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

from storage.readback import ReadBackError, open_regular

_CHUNK = 64 * 1024  # how much to read at a time when looking backwards for a newline
MARK_WINDOW = 1 << 20  # line_mark hashes at most this much of a (pathologically long) line


class JournalError(Exception):
    """A complete line of the journal (or a row read before it) is not a record of this
    run, or the file is not one a journal can be: "<path>: line N: <what is wrong>"."""


class JournalWriteError(OSError):
    """An append failed (no space, quota, I/O error) and was cut back off the file: none of
    its lines count. errno and filename are the failure's and the journal's."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _open_read(path: Path) -> BinaryIO:
    """A journal or attempt log, opened to read only if it is a regular file: a FIFO or a
    device standing in its place is damage, never a hang."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except ReadBackError as e:
        raise JournalError(str(e)) from None


# -- appending -----------------------------------------------------------------------------

class LineLog(Protocol):
    """What a run's log is written to: whole lines appended durably, all of a group or
    none (Journal's file; a test's list)."""

    def append(self, lines: Iterable[bytes]) -> int: ...

    def close(self) -> None: ...


class Journal:
    """Appends lines durably, all of a group or none. Opening cuts a torn tail left by a
    crash."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644)
        self._undo_failed: OSError | None = None
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):  # a FIFO would fill, then block
                raise JournalError(f"{path}: not a regular file")
            os.set_blocking(self._fd, True)
            size = os.fstat(self._fd).st_size
            keep = _complete_length(self._fd, size)
            if keep != size:
                os.ftruncate(self._fd, keep)
                os.fsync(self._fd)
        except BaseException:
            self.close()
            raise

    def append(self, lines: Iterable[bytes]) -> int:
        """Write and fsync newline-terminated lines; returns the bytes written. On failure
        the file is cut back to its length before this call and JournalWriteError raised."""
        group = list(lines)
        payload = b"".join(group)
        if not payload:
            return 0
        if self._fd < 0:
            raise ValueError(f"{self.path}: the journal is closed")
        if self._undo_failed is not None:
            # Something of a failed group may still be on file: appending after it would
            # bury it mid-journal. Reopening cuts a torn tail.
            raise JournalWriteError(self._undo_failed.errno,
                                    "an earlier failed append could not be cut off; reopen "
                                    f"the journal ({len(group)} records not written)",
                                    str(self.path))
        length = os.fstat(self._fd).st_size
        try:
            view = memoryview(payload)
            while view:
                written = os.write(self._fd, view)  # may write only part: loop on the rest
                if written <= 0:
                    raise OSError(errno.EIO, "write made no progress")
                view = view[written:]
            os.fsync(self._fd)
        except BaseException as e:
            self._cut_back(length)
            if not isinstance(e, OSError):
                raise
            reason = os.strerror(e.errno) if e.errno else str(e)
            raise JournalWriteError(e.errno, f"{reason[:1].lower()}{reason[1:]} "
                                    f"({len(group)} records not written)",
                                    str(self.path)) from e
        return len(payload)

    def _cut_back(self, length: int) -> None:
        try:
            os.ftruncate(self._fd, length)
            os.fsync(self._fd)
        except OSError as e:
            self._undo_failed = e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _complete_length(fd: int, size: int) -> int:
    """Where the complete part of a file ends: just after its last newline. Reads backwards
    from the end, so only the torn tail and the line before it are read."""
    pos = size
    while pos > 0:
        lo = max(0, pos - _CHUNK)
        cut = os.pread(fd, pos - lo, lo).rfind(b"\n")
        if cut >= 0:
            return lo + cut + 1
        pos = lo
    return 0


# -- reading back ----------------------------------------------------------------------------

def complete_blocks(path: Path, start: int,
                    block: int) -> Generator[tuple[bytes, int], None, None]:
    """The file's complete lines from byte `start` on, read `block` bytes at a time (a
    million-trial journal is hundreds of MB, which its parsed rows need not sit next to):
    (data, n) with whole lines in data[:n], n > 0; the rest of data is a line begun, carried
    into the next. A file that lacks what was read of it before is a JournalError."""
    if not path.exists():
        if start > 0:
            raise JournalError(f"{path}: missing, but {start} bytes of it were read before")
        return
    with _open_read(path) as f:
        size = os.fstat(f.fileno()).st_size
        if start > size:
            raise JournalError(f"{path}: holds {size} bytes, fewer than the {start} "
                               "read before")
        if start > 0 and os.pread(f.fileno(), 1, start - 1) != b"\n":
            raise JournalError(f"{path}: byte {start} does not begin a line")
        f.seek(start)
        rest = b""
        while chunk := f.read(block):
            data = rest + chunk
            n = data.rfind(b"\n") + 1  # a torn last line has no newline yet
            if n:
                yield data, n
            rest = data[n:]


def complete_lines(path: Path) -> list[bytes]:
    """Every complete line of a small file (the attempt log), without its newline; none
    when there is no file."""
    raw = b""
    if path.exists():
        with _open_read(path) as f:
            raw = f.read()
    return raw[: raw.rfind(b"\n") + 1].split(b"\n")[:-1]


def lines_before(path: Path, offset: int) -> int:
    """How many lines end before byte `offset`: a line's number, for a message only (it
    costs a pass over them)."""
    count = 0
    with _open_read(path) as f:
        while f.tell() < offset:
            chunk = f.read(min(_CHUNK * 16, offset - f.tell()))
            if not chunk:
                break
            count += chunk.count(b"\n")
    return count


def line_mark(path: Path, end: int) -> str | None:
    """A short hash of the complete line ending exactly at byte `end`; None if end is 0,
    beyond the file (or there is no file), or not just after a newline. Stored with a
    journal offset, it tells whether a journal found later is the one that offset was
    taken from. Reads only that line (at most MARK_WINDOW bytes of it)."""
    if end <= 0 or not path.exists():
        return None
    with _open_read(path) as f:
        fd = f.fileno()
        if end > os.fstat(fd).st_size or os.pread(fd, 1, end - 1) != b"\n":
            return None
        pieces: list[bytes] = []
        pos, floor = end - 1, max(0, end - MARK_WINDOW)
        while pos > floor:
            lo = max(floor, pos - _CHUNK)
            chunk = os.pread(fd, pos - lo, lo)
            cut = chunk.rfind(b"\n")
            pieces.append(chunk[cut + 1:])
            if cut >= 0:
                break
            pos = lo
    line = b"".join(reversed(pieces)) + b"\n"
    return hashlib.sha256(line).hexdigest()[:16]
