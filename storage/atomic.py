"""Atomic replacement of a file: write a temp file beside it, fsync, rename, fsync the folder.

A reader sees the old file or the new one, never a torn mix, whatever kills the writer; a
write that fails (a full disk) removes its temp file and leaves the old file as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_atomically(path: Path, write: Callable[[str], object],
                       durable: bool = True) -> None:
    """Call write(temp_path) to fill a temp file (its result is ignored), then move it over
    path durably. durable=False leaves the fsyncs to the caller, who writes many files and
    then makes them durable at once (storage/durable.py)."""
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        write(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # a write error names no file: say which one failed
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# What mkstemp adds to a prefix: 8 random characters and the suffix.
_TEMP_TAIL = len("XXXXXXXX.tmp")


def _temp_prefix(path: Path) -> str:
    """`.NAME.`, with NAME cut (on a character's boundary) so that the temp file's name
    fits the folder's limit on a name (NAME_MAX, 255 bytes on most filesystems) even where
    the file's own name nearly fills it."""
    try:
        limit = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    room = max(limit - _TEMP_TAIL - 2, 1)
    name = path.name.encode(errors="surrogateescape")[:room].decode(errors="ignore")
    return f".{name}."


def write_bytes_atomically(path: Path, data: bytes, durable: bool = True) -> None:
    replace_atomically(path, lambda tmp: Path(tmp).write_bytes(data), durable)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import: reading it means setting it, which is not safe while another thread
# (the table checkpoint) creates files.
_UMASK = _read_umask()
