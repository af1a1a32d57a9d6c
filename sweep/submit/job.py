"""One submitted job, followed from here to its end: its logs shown, the first signal
passed on as a stop, the second a detach, and the sweep's own exit code given back."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sweep import EXIT_FAILED, EXIT_OK
from sweep.console import Output
from sweep.run.stop import StopController
from sweep.submit.dashboard import HOW_TO_INSTALL
from sweep.submit.entrypoint import GCS_MARK, RUN_DIR_MARK
from sweep.submit.errors import one_line

# How long the job's supervisor lets a stopped sweep drain (see sweep/submit/__init__.py).
STOP_WAIT_VAR = "RAY_JOB_STOP_WAIT_TIME_S"
_SUMMARY = re.compile(r"^sweep .*: (complete|interrupted|failed) — \d+ of \d+ trials")
_RESULTS = re.compile(r"^  results: (.+)/trials\.parquet$")
_CACHED = re.compile(r"^sweep .*: cached — ")  # answered from the cache: no run directory


@dataclass
class Job:
    """One submitted job: follow its logs to its end, stop it on the first signal, stop
    waiting on the second."""

    client: Any
    url: str
    grace_s: int
    io: Output
    submission_id: str
    signalled: list[int] = field(default_factory=list)
    stop_sent: bool = False
    run_dir: str | None = None  # as the entrypoint expanded it on the head
    gcs: str | None = None
    state: str | None = None  # the sweep's summary: complete, interrupted, failed
    results_dir: str | None = None  # named by the summary: the run exists
    no_module: bool = False  # the head's Python lacks this project
    cached: bool = False  # the cache answered: nothing ran, no run directory was made
    _info: Any = field(default=None, init=False, repr=False)  # the terminal JobDetails
    _partial: str = field(default="", init=False, repr=False)  # a log line cut mid-chunk
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _wake: asyncio.Event | None = field(default=None, init=False, repr=False)

    # signals

    def signals(self, stop: StopController) -> _Handlers:
        return _Handlers(self, stop)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled.append(signum)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # following

    def follow(self) -> int:
        """Logs to stdout until the job ends (or a second signal); the exit code."""
        ended = asyncio.run(self._follow())
        if ended is None:  # lost the dashboard
            return EXIT_FAILED
        if not ended:
            self._detached()
            return 128 + self.signalled[0]
        return self._ended()

    async def _follow(self) -> bool | None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tail = asyncio.create_task(self._tail())
        try:
            while True:
                if self.signalled and not self.stop_sent:
                    self._stop()
                if len(self.signalled) >= 2:
                    return False
                waiter = asyncio.create_task(self._wake.wait())
                done, _ = await asyncio.wait({tail, waiter},
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                self._wake.clear()
                if tail in done:
                    break
        finally:
            if not tail.done():
                tail.cancel()
                await asyncio.gather(tail, return_exceptions=True)
            self._loop = None
        self._flush_partial()
        failure = tail.exception()
        status = await asyncio.to_thread(self._final_status)
        if status is None:
            why = f" ({one_line(failure)})" if failure else ""
            self.io.note(f"error: lost the job's logs at {self.url}{why}; the job may still "
                          "be running")
            self._commands()
            return None
        return True

    async def _tail(self) -> None:
        async for chunk in self.client.tail_job_logs(self.submission_id):
            self._scan(chunk)

    def _scan(self, chunk: str) -> None:
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line.rstrip("\r"))

    def _flush_partial(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def _line(self, line: str) -> None:
        """One line of the job's log: shown, unless it is the entrypoint's note to this
        client (where the run directory would be: a sweep the cache answers makes none,
        so it is named only once the sweep's summary names it)."""
        if line.startswith(RUN_DIR_MARK):
            self.run_dir = self.run_dir or (None if self.cached else line[len(RUN_DIR_MARK):])
            return
        if line.startswith(GCS_MARK):
            self.gcs = self.gcs or line[len(GCS_MARK):] or None
            return
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if _CACHED.match(line):
            self.run_dir = None
            self.cached = True
        elif m := _SUMMARY.match(line):
            self.state = m.group(1)
        elif m := _RESULTS.match(line):
            self.results_dir = m.group(1)
        elif "No module named sweep" in line:
            self.no_module = True

    def _stop(self) -> None:
        """Ask Ray once to stop the job (its supervisor SIGTERMs the sweep)."""
        self.stop_sent = True
        name = signal.Signals(self.signalled[0]).name
        try:
            self.client.stop_job(self.submission_id)
        except Exception as e:  # the dashboard gone: say how to stop it later
            self.io.note(f"\n{name}: could not ask {self.url} to stop job "
                          f"{self.submission_id} ({one_line(e)}); stop it with: "
                          f"{self._ray_job('stop')}")
            return
        self.io.note(f"\n{name}: asked job {self.submission_id} to stop: the sweep finishes "
                      f"its in-flight trials and writes its table (Ray allows it "
                      f"{self.grace_s} s); Ctrl+C again to stop waiting (the job goes on)")

    def _final_status(self) -> Any:
        """The job's terminal status (the log stream ends just after it), or None when the
        dashboard cannot tell within a few seconds."""
        deadline = time.monotonic() + 10
        while True:
            try:
                info = self.client.get_job_info(self.submission_id)
                if info.status.is_terminal():
                    self._info = info
                    return info.status
            except Exception:  # the dashboard went away: retried until the deadline
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    # endings

    def _ray_job(self, what: str) -> str:
        follow = " -f" if what == "logs" else ""
        return (f"ray job {what}{follow} {shlex.quote(self.submission_id)} "
                f"--address {shlex.quote(self.url)}")

    def _commands(self) -> None:
        self.io.result(f"  follow it: {self._ray_job('logs')}")
        self.io.result(f"  stop it:   {self._ray_job('stop')}")
        self._where()

    def _where(self) -> None:
        path = self.results_dir or self.run_dir
        if path is None or self.cached:
            return
        self.io.result(f"  run directory (on the head node): {path}")
        address = f" --address {shlex.quote(self.gcs)}" if self.gcs else ""
        self.io.result(f"  resume on the head node: sweep resume {shlex.quote(path)}{address}")
        env = json.dumps({"env_vars": {STOP_WAIT_VAR: str(self.grace_s)}})
        self.io.result(f"  or from here, as a job: ray job submit --address "
                      f"{shlex.quote(self.url)} --working-dir . --runtime-env-json "
                      f"{shlex.quote(env)} -- python -m sweep resume {shlex.quote(path)}")

    def _detached(self) -> None:
        name = signal.Signals(self.signalled[1]).name
        self.io.result(f"\n{name} again: no longer waiting; job {self.submission_id} goes on "
                      "(it was asked to stop and is finishing its in-flight trials)")
        self._commands()

    def _ended(self) -> int:
        info = self._info
        status = str(info.status.value if hasattr(info.status, "value") else info.status)
        code = self._exit_code(info)
        exited = f" (the sweep exited {info.driver_exit_code})" \
            if info.driver_exit_code is not None else ""
        self.io.result(f"sweep submit: job {self.submission_id} {status}{exited}")
        if status == "FAILED" and info.driver_exit_code is None:
            self.io.note(f"error: {one_line(RuntimeError(info.message or ''))}")
        if self.no_module:
            self.io.note("error: the head node's Python cannot import this project; "
                          f"install it on every node ({HOW_TO_INSTALL})")
        if self.results_dir is not None:
            self._where()
        return code

    def _exit_code(self, info: Any) -> int:
        status = str(info.status.value if hasattr(info.status, "value") else info.status)
        if status == "SUCCEEDED":
            return EXIT_OK
        if status == "FAILED":
            return info.driver_exit_code if info.driver_exit_code is not None else EXIT_FAILED
        # STOPPED: Ray records no exit code; the sweep's summary says how it ended.
        if self.state == "complete":
            return EXIT_OK
        if self.signalled:
            return 128 + self.signalled[0]
        if self.state == "interrupted":  # `ray job stop` from elsewhere: its SIGTERM
            return 128 + signal.SIGTERM
        return EXIT_FAILED


class _Handlers:
    """Our SIGINT/SIGTERM handlers for the command's duration; a signal that reached the
    CLI's StopController before them (during start-up) counts as the first."""

    def __init__(self, job: Job, stop: StopController) -> None:
        self.job = job
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if self.stop.signum is not None:
            self.job.signalled.append(self.stop.signum)
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self.job.on_signal)

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
