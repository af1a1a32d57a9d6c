"""The process that launches kernels, owned by a worker and replaced when it is poisoned.

A sticky CUDA error (an illegal memory access, say) makes every later CUDA call of its
process fail. So a worker does not launch kernels itself: a launcher subprocess validates
and times each config, and the worker talks to it through a pipe. When the launcher
reports its context poisoned, or dies outright, the worker records the config and starts
a new launcher; the worker's queue, compile pool and place in the driver all stay.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from actors import child
from actors.compile_pool import Compiled
from actors.timing import Timing
from storage.records import TrialOutcome, clip_error


def serve(read_fd: int, write_fd: int, payload: str) -> None:
    inbox, outbox = child.connect(read_fd, write_fd)
    options = json.loads(payload)
    if options["interpret"]:
        # Triton picks interpreter or compiler when a kernel module is imported.
        os.environ["TRITON_INTERPRET"] = "1"
    from actors.triton_backend import ProcessPoisoned, TritonBackend
    from sweep_kernels import load_kernel

    kernel = load_kernel(options.pop("kernel"), options.pop("kernel_path"))
    backend = TritonBackend(kernel, **options)
    outbox.send(("ready", backend.device_name))
    while True:
        try:
            op, args = inbox.recv()
        except EOFError:
            return
        reply: tuple[str, Any]
        try:
            reply = ("ok", backend.run_trial(*args) if op == "trial" else backend.retime(*args))
        except ProcessPoisoned as e:
            outbox.send(("poisoned", e.outcome))
            os._exit(3)  # nothing more can run here; skip exit hooks that touch CUDA
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        outbox.send(reply)


class LauncherDied(Exception):
    pass


class Launcher:
    """The worker's side: a Backend whose trials run in the launching process."""

    def __init__(self, kernel: str, problem: Mapping[str, Any], *, kernel_path: str,
                 interpret: bool,
                 trial_timing: tuple[float, float], finalist_timing: tuple[float, float],
                 tolerance: tuple[float, float] | None, seed: int) -> None:
        self._payload = json.dumps({
            "kernel": kernel, "kernel_path": kernel_path, "problem": dict(problem),
            "interpret": interpret,
            "trial_timing": trial_timing, "finalist_timing": finalist_timing,
            "tolerance": tolerance, "seed": seed})
        self._child = child.start("actors.launcher:serve", self._payload)
        self._ready = False
        self.device_name = self.wait_ready()

    def wait_ready(self) -> str:
        if not self._ready:
            try:
                _, device_name = self._child.replies.recv()
            except EOFError:
                raise RuntimeError("the kernel-launching process failed to start "
                                   f"({self._child.exit_text()})") from None
            self._ready = True
            self.device_name = device_name
        return self.device_name

    def _restart(self) -> None:
        child.kill(self._child)
        self._child = child.start("actors.launcher:serve", self._payload)
        self._ready = False

    def _call(self, op: str, *args: Any) -> tuple[str, Any]:
        self.wait_ready()
        try:
            self._child.requests.send((op, args))
            kind, value = self._child.replies.recv()
        except (EOFError, OSError):
            why = self._child.exit_text()
            self._restart()
            raise LauncherDied(why) from None
        if kind == "poisoned":  # it has exited; the outcome it sent says why
            self._restart()
        return kind, value

    def run_trial(self, config: Mapping[str, Any], seed: int,
                  compiled: Compiled | None = None) -> TrialOutcome:
        """A death may be no fault of the config (the launcher may have been killed from
        outside), so it gets a second launcher before it is recorded `crashed`."""
        deaths: list[str] = []
        while len(deaths) < 2:
            try:
                kind, value = self._call("trial", dict(config), seed, compiled)
            except LauncherDied as e:
                deaths.append(str(e))
                continue
            if kind == "error":  # the backend maps kernel errors itself; this is a bug
                raise RuntimeError(value)
            return value
        return TrialOutcome("crashed", "skipped", error=clip_error(
            f"the process launching kernels died on this config twice ({', '.join(deaths)})"))

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> list[Timing]:
        kind, value = self._call("retime", [dict(c) for c in configs], rounds)
        if kind != "ok":
            raise RuntimeError(f"re-timing failed: {value}")
        return value
