"""Making what a writer created durable: new folders' names in their parents, and a batch
of files at once (syncfs(2) of their filesystem alone, or an fsync of each file and folder
where the system has no syncfs), rather than two fsyncs a file or an os.sync() of every
filesystem that no signal interrupts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path


def make_dirs(folder: Path) -> list[Path]:
    """mkdir -p, returning the folders whose listing it changed (each new folder's
    parent): what must be fsynced for the new folders to survive a crash."""
    missing: list[Path] = []
    for d in (folder, *folder.parents):
        if d.is_dir():
            break
        missing.append(d)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it first
            d.mkdir()
    return [d.parent for d in reversed(missing)]


def fsync_dirs(folders: Iterable[Path]) -> None:
    for d in folders:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def sync_batch(root: Path, written: Sequence[Path], touched: Iterable[Path]) -> None:
    """Make a batch's files and folders durable: syncfs(2) of the cache's filesystem
    alone (not os.sync(), which flushes every filesystem and cannot be interrupted), or
    where there is none, an fsync of each file written and each folder touched."""
    if _syncfs(root):
        return
    for path in written:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dirs(sorted(set(touched)))


@functools.cache
def _libc_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs (Linux); None where the C library has none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def _syncfs(root: Path) -> bool:
    """syncfs(2) of root's filesystem; False where the system has none."""
    syncfs = _libc_syncfs()
    if syncfs is None:
        return False
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            if err == errno.ENOSYS:
                return False
            raise OSError(err, os.strerror(err), str(root))
    finally:
        os.close(fd)
    return True
