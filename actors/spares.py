"""Python interpreters started ahead of the processes they will become.

A GPU run's launchers and fork server begin with `import torch` (3-5 s on an H200 host),
but only once the command has read its spec, and the command first imports pyarrow and
the rest of itself: about a second there (BENCHMARKS.md, where the warm run's first
seconds go). A spare is started in the command's first milliseconds with the environment
one of those processes will have; it imports torch and Triton while the command goes on,
then waits on its stdin for what to become. A process started later with that very
environment takes a spare instead of a fresh interpreter (become); a spare no process
takes is ended with the command. Nothing a run records depends on it: a spare that is
missing, dead or of another environment only means a fresh start, as before.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable

from actors import child, trace

# What every process a spare may become does first: Triton's hash of itself (0.6 s on an
# H200 host, on a thread: see triton_warm), torch's and Triton's imports.
AHEAD = ("actors.triton_warm:key_triton", "torch", "triton")

_SPARES: list[tuple[dict[str, str], subprocess.Popen]] = []  # this process's, untaken


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
            child.kill_process(process)
            return become(entry, *args, env=env, out=out)
        return process
    return None


def end() -> None:
    """Every spare not taken ends (they would at this process's end anyway)."""
    while _SPARES:
        child.kill_process(_SPARES.pop()[1])


def serve(*imports: str) -> None:
    """In the spare: import, wait for an order, become it. What it prints before its order
    is kept and goes to the order's file first."""
    kept = tempfile.TemporaryFile()  # noqa: SIM115 - the process's own, to its end
    for fd in (1, 2):
        os.dup2(kept.fileno(), fd)
    trace.note("spare_started")
    for name in imports:
        # A module that fails here fails again, and says so, where the process imports
        # it as what it becomes.
        module, _, function = name.partition(":")
        with contextlib.suppress(Exception):
            imported = importlib.import_module(module)
            if function:
                getattr(imported, function)()
    trace.note("spare_imported")
    line = sys.stdin.readline()
    if not line:
        os._exit(0)  # the command ended without taking it
    order = json.loads(line)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    kept.seek(0)
    with open(order["out"], "ab") as out:
        shutil.copyfileobj(kept, out)
        out.flush()
        for fd in (1, 2):
            os.dup2(out.fileno(), fd)
    kept.close()
    module, _, function = order["entry"].partition(":")
    getattr(importlib.import_module(module), function)(*order["args"])
