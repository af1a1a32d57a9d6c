"""An opt-in trace of where a run's compile and device time goes, for benchmarks: with
SWEEP_TRACE=FILE each process of the run appends one JSON line per event (a config sent to
a compile process, a compile ended, a pool process up, a trial begun) with the wall clock
and its pid. Off, it costs one dictionary lookup per event."""

from __future__ import annotations

import json
import os
import time
from typing import Any

TRACE_ENV = "SWEEP_TRACE"


def note(event: str, **fields: Any) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields},
                      default=str)
    try:  # one write of a short line with O_APPEND: lines of several processes stay whole
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a trace is never worth a run
