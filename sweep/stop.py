"""Ctrl+C and SIGTERM: the first asks the sweep to stop cleanly, the second ends it at once.

Exiting at once is safe because a trial counts as done only once its record is fsync'd in
the journal, and every other file in the run directory is replaced atomically.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


class StopController:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """(Re)install the handlers; Ray's init replaces the SIGTERM one, so call it after."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Give the handlers back, for callers that run the CLI in-process (tests)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def request(self, signum: int) -> None:
        self.signum = self.signum or signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            sys.stderr.write(f"\n{signal.Signals(signum).name} again: exiting now; "
                             "the journal holds every finished trial\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum = signum
        sys.stderr.write(f"\n{signal.Signals(signum).name}: stopping (finishing in-flight "
                         "trials); send it again to exit at once\n")
        sys.stderr.flush()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0
