"""Python interpreters started ahead of the processes they will become.

A GPU run's launchers and fork server begin with `import torch` (3-5 s on an H200 host),
but only once the command has read its spec, and the command first imports pyarrow and
the rest of itself: about a second there (BENCHMARKS.md, where the warm run's first
seconds go). A spare is started in the command's first milliseconds with the environment
one of those processes will have; it imports torch and Triton while the command goes on,
then waits on its stdin for what to become. A process started later with that very
environment takes a spare instead of a fresh interpreter (become); a spare no process
takes is ended once the run has begun its early start, or with the command (end).
Nothing a run records depends on it: a spare that is missing, dead or of another
environment only means a fresh start, as before.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable

from actors import child, trace

# What every process a spare may become does first: Triton's hash of itself (0.6 s on an
# H200 host, on a thread: see triton_warm), torch's and Triton's imports.
AHEAD = ("actors.triton_warm:key_triton", "torch", "triton")

# This process's spares not yet taken; started, taken and ended on its main thread only.
_SPARES: list[tuple[dict[str, str], subprocess.Popen]] = []


def start(envs: Iterable[dict[str, str]], imports: Iterable[str] = AHEAD) -> None:
    """A spare for each environment (each the whole environment, as its process will get
    it), importing `imports` from now on (a "module:function" is called, with nothing)."""
    for env in envs:
        _SPARES.append((env, child.start_spare("actors.spares:serve", *imports, env=env)))


def become(entry: str, *args: str, env: dict[str, str], out: str) -> subprocess.Popen | None:
    """A spare of exactly this environment made to run entry ("module:function") as
    function(*args), printing to the file at `out` (appended), as child.start_detached
    would; None where there is none alive: start one afresh."""
    for k, (given, process) in enumerate(_SPARES):
        if given != env:
            continue
        del _SPARES[k]
        order = json.dumps({"entry": entry, "args": list(args), "out": out})
        try:
            assert process.stdin is not None
            process.stdin.write(order.encode() + b"\n")
            process.stdin.close()
        except (OSError, ValueError):  # it died (its import failed, say)
            _end(process)
            return become(entry, *args, env=env, out=out)
        return process
    return None


def end() -> None:
    """Every spare not taken ends now (they would with this process anyway), not awaited:
    one stuck in a read of a hung filesystem must not hold up the command."""
    while _SPARES:
        _end(_SPARES.pop()[1])


def _end(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its own session: its group is its pid
    threading.Thread(target=process.wait, daemon=True).start()  # reaped once it ends


def serve(*imports: str) -> None:
    """In the spare: import, wait for an order, become it. What it prints before its order
    is kept and goes to the order's file first."""
    kept = tempfile.TemporaryFile()  # noqa: SIM115 - the process's own, to its end
    for fd in (1, 2):
        os.dup2(kept.fileno(), fd)
    trace.note("spare_started")
    for name in imports:
        module, _, function = name.partition(":")
        try:
            imported = importlib.import_module(module)
            if function:
                getattr(imported, function)()
        except Exception:
            # A second import of a half-imported module may fail otherwise than the first:
            # a fresh process says why (become finds this one gone).
            os._exit(1)
    trace.note("spare_imported")
    line = sys.stdin.readline()
    if not line:
        os._exit(0)  # the command ended without taking it
    order = json.loads(line)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with open(order["out"], "ab") as out:
        # pread leaves alone the offset fds 1 and 2 share with kept, where a thread of
        # this process may still write.
        offset = 0
        while chunk := os.pread(kept.fileno(), 1 << 16, offset):
            out.write(chunk)
            offset += len(chunk)
        out.flush()
        for fd in (1, 2):
            os.dup2(out.fileno(), fd)
    kept.close()

    module, _, function = order["entry"].partition(":")
    getattr(importlib.import_module(module), function)(*order["args"])
