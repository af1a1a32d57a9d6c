"""Running a command as a user does, for benchmarks/third_party.py: from launch to exit
on the wall clock, every line to the kernel's log as it comes, stopped resumably past its
time limit; and the environment its sweeps run in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from benchmarks.third_party_cases import HERE, ROOT

STOP_GRACE_S = 60.0  # after SIGINT, before SIGKILL, for a command past its time limit


class Log:
    """One kernel's log under --out: every line of its commands as it comes, so a call
    killed at its time limit keeps what it did."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", buffering=1)
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            self.file.write(text if text.endswith("\n") else text + "\n")
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_command(argv: Sequence[Any], log: Log, env: dict[str, str], timeout_s: float,
                cwd: Path = HERE) -> dict[str, Any]:
    """argv from launch to exit: its wall clock, exit code and lines (also to the log,
    each marked with its stream and seconds since launch). Past timeout_s it gets SIGINT
    (a sweep then stops resumably, writing everything), then SIGKILL."""
    log.write(f"==== {time.strftime('%H:%M:%S')} {' '.join(map(str, argv))}")
    launched, t0 = time.time(), time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, text=True, bufsize=1,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
    pumps = [threading.Thread(target=_pump, args=(stream, name, lines[name], log, t0),
                              daemon=True)
             for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for p in pumps:
        p.start()
    stopped = _wait(proc, timeout_s)
    exited = time.monotonic()
    for p in pumps:
        p.join(timeout=10)
    log.write(f"==== exit {proc.returncode} after {exited - t0:.1f} s"
              + (f" (stopped by this script: {stopped})" if stopped else ""))
    return {"argv": [str(a) for a in argv], "rc": proc.returncode, "command_s": exited - t0,
            "launched_at": launched, "stopped_by_benchmark": stopped,
            "stdout": lines["stdout"], "stderr": lines["stderr"]}


def _pump(stream: IO[str], name: str, into: list[str], log: Log, t0: float) -> None:
    """One stream's lines, kept and logged as they come (a thread per stream, so neither
    pipe fills while the other is read)."""
    for line in stream:
        line = line.rstrip("\n")
        into.append(line)
        log.write(f"[{time.monotonic() - t0:7.1f} s {name[3:]}] {line}")


def _wait(proc: subprocess.Popen[str], timeout_s: float) -> str | None:
    """Until proc exits; past timeout_s, SIGINT to its group, then SIGKILL after the
    grace. Which signal it took, if any."""
    try:
        proc.wait(timeout=timeout_s)
        return None
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)  # the group run_command started for it
    try:
        proc.wait(timeout=STOP_GRACE_S)
        return "SIGINT"
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return "SIGKILL"


def sweep_env(cache: Path, sweep_cache: Path, smoke: bool) -> dict[str, str]:
    """The caller's environment (PYTHONPATH with the packages' wheels, say) plus an empty
    Triton cache of the sweep's own, a best-config cache apart from the user's, and this
    checkout importable for `python -m sweep` wherever it is not installed."""
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "SWEEP_CACHE_DIR": str(sweep_cache),
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    return env
