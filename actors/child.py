"""Processes a worker owns (compile processes, the kernel launcher): started, wired and
killed the same way.

Each is a plain `python -c` subprocess rather than multiprocessing's spawn, which would
re-import the Ray worker's main script. It gets its own session, so a kill of its process
group reaches the compilers it runs (Triton runs ptxas as a child), and it asks Linux to
kill it when the worker dies (PR_SET_PDEATHSIG); where that is unavailable, the closed pipe
ends it at its next read. Messages go both ways over pipes as multiprocessing
Connections: pickles, but only between processes of the same worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection


@dataclass
class Child:
    process: subprocess.Popen
    replies: Connection
    requests: Connection

    def exit_text(self) -> str:
        """How the process ended, for an error message: 'killed by SIGSEGV', 'exit code 1'."""
        code = self.process.wait(timeout=5)
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


def start(entry: str, payload: str) -> Child:
    """Run `entry` ("module:function") in a new process; it is called as
    function(read_fd, write_fd, payload) and talks over the two pipes (see connect)."""
    module, _, function = entry.partition(":")
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    process = subprocess.Popen(
        # `-c` puts the current directory first on sys.path, where a user's folder could
        # shadow this project's packages: take it off.
        [sys.executable, "-c", "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
         f"from {module} import {function}; "
         f"{function}(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])",
         str(child_reads), str(child_writes), payload],
        pass_fds=(child_reads, child_writes), start_new_session=True)
    os.close(child_reads)
    os.close(child_writes)
    return Child(process, Connection(parent_reads, writable=False),
                 Connection(parent_writes, readable=False))


def connect(read_fd: int, write_fd: int) -> tuple[Connection, Connection]:
    """In the child: (inbox, outbox), after arranging to die with the parent."""
    _die_with_parent()
    return Connection(read_fd, writable=False), Connection(write_fd, readable=False)


def _die_with_parent() -> None:
    # The signal is sent when the thread that started this process ends: workers start
    # their children from threads that live as long as the worker (its constructor's and
    # Ray's task threads).
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PDEATHSIG


def kill(child: Child) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signal.SIGKILL)
    child.process.kill()
    child.process.wait(timeout=5)
    child.replies.close()
    child.requests.close()
