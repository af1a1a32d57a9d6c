"""Reading back what a run directory or the cache holds: every such file is input, checked
like a spec, never trusted.

A file is read only if it is a regular file (a FIFO is opened without blocking and then
refused; a link to /dev/zero is refused by what it points to) and no larger than a limit
for its kind, so a damaged or hostile file is one line of refusal, never a hang or a
process grown to gigabytes.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

# Ample for each kind of file, far below what would hurt: a state file is kilobytes.
STATE_LIMIT = 64 * 2**20  # run.json, snapshot.json, best.json, a cache entry


class ReadBackError(ValueError):
    """A file a run or the cache holds cannot be taken as written: one line, naming it."""

    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = Path(path), why


def open_regular(path: Path | str, limit: int | None = None) -> int:
    """A read-only descriptor on path, a regular file of at most limit bytes (None: any
    size). FileNotFoundError when there is none; ReadBackError for anything else that
    stands there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ReadBackError(path, f"cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReadBackError(path, f"not a regular file but a {_kind(st.st_mode)}")
        if limit is not None and st.st_size > limit:
            raise ReadBackError(path, f"{st.st_size:,} bytes, more than such a file holds "
                                      f"(at most {limit:,})")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_small(path: Path | str, limit: int = STATE_LIMIT) -> bytes:
    """The whole of a regular file of at most limit bytes (one that grows while read is
    cut at limit + 1 bytes, and refused)."""
    fd = open_regular(path, limit)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ReadBackError(path, f"more than such a file holds (at most {limit:,} bytes)")
    return b"".join(chunks)


def read_json(path: Path | str, limit: int = STATE_LIMIT) -> Any:
    """A JSON document read with read_small. NaN and Infinity are refused: none of our
    files writes them, so one that holds them was written by something else."""
    data = read_small(path, limit)
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise ReadBackError(path, f"not valid JSON ({e})") from None


def finite(value: Any, *, low: float = -math.inf, high: float = math.inf) -> bool:
    """A real number (not a bool) within [low, high]."""
    try:  # an integer past a float's range cannot say whether it is finite: it is not
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value) and low <= value <= high
    except OverflowError:
        return False


def scalar(value: Any) -> bool:
    """A value a config or problem may hold: a string, a bool or a finite number."""
    return isinstance(value, (str, bool)) or finite(value)


# C0 (newlines and tabs among them), DEL, C1 (a lone 0x9b is a terminal's CSI), and the
# bidirectional marks, overrides and isolates, which reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def escaped(text: str) -> str:
    """text on one line with every control character escaped as JSON escapes it (\\n,
    \\u001b): readable, and a JSON document stays one, meaning the same. The one rule for
    text from a spec or a run directory (someone else's) on its way to a terminal."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group()) or f"\\u{ord(m.group()):04x}", text)


def printable(text: str, limit: int = 200) -> str:
    """escaped(text), cut at limit."""
    out = escaped(text)
    return out if len(out) <= limit else out[:limit] + "…"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"
