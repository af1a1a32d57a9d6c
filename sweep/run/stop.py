"""Ctrl+C and SIGTERM: the first asks the sweep to stop cleanly, the second ends it at once.

Exiting at once is safe because a trial counts as done only once its record is fsync'd in
the journal, and every other file in the run directory is replaced atomically.

The command keeps its handlers to the end; the Python API installs them for the duration
of a call only, and there a second signal raises KeyboardInterrupt instead of ending the
process (a notebook's kernel must survive it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType


class StopController:
    def __init__(self, exit_at_once: bool = True,
                 asked: Callable[[], bool] = lambda: False) -> None:
        """exit_at_once: a second signal ends the process (the command), else it raises
        KeyboardInterrupt in the main thread (an in-process caller). asked: a stop asked
        for without a signal (an API caller's event: a call from another thread has no
        handlers)."""
        self.signum: int | None = None
        self.exit_at_once = exit_at_once
        self._asked = asked
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """(Re)install the handlers; Ray's init replaces the SIGTERM one, so call it after.
        Only the main thread may: a call from another thread stops only when `asked`
        says so."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Give back the handlers install() replaced (an in-process caller's)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def request(self, signum: int) -> None:
        self.signum = self.signum or signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            sys.stderr.write(f"\n{signal.Signals(signum).name} again: "
                             f"{'exiting' if self.exit_at_once else 'stopping'} now; "
                             "the journal holds every finished trial\n")
            sys.stderr.flush()
            if not self.exit_at_once:
                raise KeyboardInterrupt
            os._exit(128 + signum)
        self.signum = signum
        sys.stderr.write(f"\n{signal.Signals(signum).name}: stopping (finishing in-flight "
                         "trials); send it again to exit at once\n")
        sys.stderr.flush()

    @property
    def requested(self) -> bool:
        return self.signum is not None or self._asked()

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0
