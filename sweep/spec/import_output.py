"""What a kernel's module prints while it is imported: never the command's stdout, which
holds the run's summary (and `sweep best`'s JSON lines). At most LIMIT characters of it go
to stderr, then one note of how much more there was.

The import runs on a thread of its own while the main thread goes on (sweep/run/opening),
so stdout is not swapped whole: a router sends the importing thread's writes aside and
every other thread's through."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

LIMIT = 4000  # characters shown, enough for a warning or two

_LOCK = threading.Lock()


class _Aside:
    """One import's output: the first LIMIT characters to stderr, the rest counted."""

    def __init__(self, what: str) -> None:
        self.what, self.shown, self.dropped = what, 0, 0

    def write(self, text: str) -> int:
        room = max(0, LIMIT - self.shown)
        if room:
            sys.stderr.write(text[:room])
        self.shown += min(room, len(text))
        self.dropped += max(0, len(text) - room)
        return len(text)

    def close(self) -> None:
        if self.dropped:
            sys.stderr.write(f"\n[{self.what} printed {self.dropped:,} more characters "
                             "while it was imported; not shown]\n")


class _Router:
    """sys.stdout while an import runs: each thread's writes to its own destination."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.aside: dict[int, _Aside] = {}

    def write(self, text: str) -> int:
        aside = self.aside.get(threading.get_ident())
        return (aside or self.original).write(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty: the original's
        return getattr(self.original, name)


@contextlib.contextmanager
def printed_aside(what: str) -> Iterator[None]:
    """What this thread prints meanwhile goes to stderr, at most LIMIT characters."""
    me = threading.get_ident()
    with _LOCK:
        router = sys.stdout if isinstance(sys.stdout, _Router) else _Router(sys.stdout)
        sys.stdout = router
        aside = router.aside[me] = _Aside(what)
    try:
        yield
    finally:
        with _LOCK:
            router.aside.pop(me, None)
            if not router.aside and sys.stdout is router:
                sys.stdout = router.original
        aside.close()
