"""One process at a time owns a run directory.

The lock is an flock(2) on DIR/.sweep.lock, held for the whole `sweep run` or
`sweep resume` session and dropped by the kernel when the process ends, however it ends: a
SIGKILLed run leaves no stale lock behind. It is taken before anything in the directory is
read or written, so there is no window between "is this directory free?" and "it is
mine". The file also names its holder, for the message a second process prints.

flock works across the hosts of an NFSv4 mount (Linux maps it to a byte-range lock); where
flock(2) fails the run is refused. A mount whose locks are local only (NFS `nolock` or
`local_lock=flock`) guards against processes of the same host alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from storage.readback import printable

LOCK_NAME = ".sweep.lock"


class RunDirBusy(Exception):
    """Another process holds the run directory; the message names it."""


@dataclass
class RunDirLock:
    directory: Path
    fd: int
    created: bool  # the file is this process's to remove

    @classmethod
    def acquire(cls, directory: Path, command: str) -> RunDirLock:
        """Lock `directory` (which must exist) or raise RunDirBusy naming the holder;
        `command` says what this process is doing, for such a message of another.
        OSError (a read-only directory, no locks on this filesystem) passes through."""
        path = directory / LOCK_NAME
        while True:
            fd, created = _open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunDirBusy(f"{directory}: in use by another sweep ({holder}); "
                                 "wait for it to end, or stop it first") from None
            except BaseException:
                os.close(fd)
                raise
            # The file locked must still be the one at the path: a holder that gave the
            # directory back may have removed it after we opened it (see release).
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                _write_holder(fd, command)
                return cls(directory, fd, created)
            os.close(fd)

    def release(self, remove: bool = False) -> None:
        """Unlock; with remove, also delete the lock file if this process made it (for a
        directory given back as it was found). It is deleted while still locked, so no one
        else holds it then. Never raises: it runs on the way out of every session."""
        if self.fd < 0:
            return
        try:
            if remove and self.created:
                with contextlib.suppress(OSError):
                    (self.directory / LOCK_NAME).unlink()
        finally:
            os.close(self.fd)
            self.fd = -1


def holder(directory: Path) -> str | None:
    """Who holds the directory, judged without taking the lock (which would make a sweep
    starting that moment fail): the holder its lock file names, if that process is alive
    on this host. None when none is named, or it is gone, or it ran on another host
    (whose processes this one cannot see: the file outlives its holder)."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW |
                     os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        doc = json.loads(os.pread(fd, 4096, 0))
        pid = doc["pid"]
        if not isinstance(pid, int) or pid <= 0 or doc.get("host") != socket.gethostname():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
        return _describe(doc)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    finally:
        os.close(fd)


def _open(path: Path) -> tuple[int, bool]:
    """The lock file, and whether this call made it; never through a link, never another
    kind of file."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    while True:
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            continue  # removed meanwhile by a holder giving it back
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{path} is not a regular file")
        return fd, False


def _write_holder(fd: int, command: str) -> None:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command[:300],
              "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    with contextlib.suppress(OSError):  # a full disk: the lock holds all the same
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)


def _read_holder(fd: int) -> str:
    try:
        return _describe(json.loads(os.pread(fd, 4096, 0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "holder unknown"


def _describe(holder: dict[str, object]) -> str:
    text = f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}: " \
        f"{holder.get('command')}"
    return printable(text, 400)  # written by the lock's holder, shown on a terminal
