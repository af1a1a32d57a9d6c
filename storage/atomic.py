"""Atomic replacement of a file: write a temp file beside it, fsync, rename, fsync the folder.

A reader sees the old file or the new one, never a torn mix, whatever kills the writer; a
write that fails (a full disk) removes its temp file and leaves the old file as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_atomically(path: Path, write: Callable[[str], object]) -> None:
    """Call write(temp_path) to fill a temp file (its result is ignored), then move it over
    path durably."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # a write error names no file: say which one failed
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_bytes_atomically(path: Path, data: bytes) -> None:
    replace_atomically(path, lambda tmp: Path(tmp).write_bytes(data))


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import: reading it means setting it, which is not safe while another thread
# (the table checkpoint) creates files.
_UMASK = _read_umask()
