"""Processes as Linux's /proc shows them: Ray's own processes are found by their parents
and command lines, since Ray tells nothing of a start it did not finish."""

from __future__ import annotations

import contextlib
import os


def children() -> dict[int, list[int]]:
    """Every live process's children, by parent pid."""
    tree: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                up = parent(int(name))
                if up is not None:
                    tree.setdefault(up, []).append(int(name))
    return tree


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def args(pid: int) -> list[str]:
    """pid's command line; [] for one gone or not to be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []
