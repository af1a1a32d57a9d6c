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
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from actors import child, trace, triton_warm
from actors.compiles import Compiled
from actors.protocol import Retimed
from storage.records import TrialOutcome, clip_error


def serve(read_fd: int, write_fd: int, payload: str) -> None:
    inbox, outbox = child.connect(read_fd, write_fd)
    _serve(inbox, outbox, _backend(payload))


def serve_prestarted(address: str, key_hex: str, payload: str) -> None:
    """A launcher started before its worker exists (sweep/engines/prestart.py): it sets up its
    device while Ray starts, then serves the worker that adopts it through a Unix socket,
    and dies with that worker as a launcher the worker started would."""
    child.die_with_parent()
    listener = Listener(address, family="AF_UNIX", authkey=bytes.fromhex(key_hex))
    backend = _backend(payload)
    connection = listener.accept()
    listener.close()
    _, adopter = connection.recv()
    threading.Thread(target=_exit_without, args=(adopter,), daemon=True).start()
    _serve(connection, connection, backend)


def _exit_without(pid: int) -> None:
    """Ends this process once `pid` is gone, even while a kernel hangs the main thread."""
    while child.alive(pid):
        time.sleep(0.2)
    os._exit(0)


def _backend(payload: str) -> Any:
    trace.note("launcher_started")
    options = json.loads(payload)
    if options["interpret"]:
        # Triton picks interpreter or compiler when a kernel module is imported.
        os.environ["TRITON_INTERPRET"] = "1"
    else:  # its first compile, before the pool's processes are up, is no slower than the rest
        triton_warm.key_triton()
    from actors.triton_backend import Budgets, TritonBackend
    from sweep_kernels import load_kernel

    kernel = load_kernel(options.pop("kernel"), options.pop("kernel_path"))
    options["timing"] = Budgets(tuple(options.pop("trial_timing")),
                                tuple(options.pop("finalist_timing")),
                                options.pop("screen", False))
    # A spec's problem as written, before its kernel's defaults were merged, is enough.
    options["problem"] = {**kernel.problem_defaults, **options["problem"]}
    return TritonBackend(kernel, **options)


def _serve(inbox: Connection, outbox: Connection, backend: Any) -> None:
    from actors.triton_backend import ProcessPoisoned

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


# A launcher makes its socket first thing, or, where a spare interpreter became it
# (actors/spares.py), once the spare's imports are done: seconds after the command began
# (5 s on a slow H200 host), while the worker asks from its first second. One alive
# without a socket has not got that far, or was adopted by a worker that is ending, and
# ends with it: wait while it lives, for as long as a worker may take to start
# (run.start_timeout_s's default).
ADOPT_WAIT_S = 60.0
# Names the launcher begun early (sweep/engines/prestart.py) that an interpreter's worker adopts, in
# its environment; a GPU's worker adopts the one of its CUDA_VISIBLE_DEVICES.
LAUNCHER_ENV = "SWEEP_LAUNCHER"


class LauncherDied(Exception):
    pass


class Launcher:
    """The worker's side: a Backend whose trials run in the launching process."""

    def __init__(self, payload: str, adopt: tuple[str, str, int] | None = None) -> None:
        """payload: the launching process's options (actors/worker.py, launcher_payload);
        adopt: (socket, key, pid) of a launcher started for this GPU before Ray was up
        (sweep/engines/prestart.py), used instead of starting one where it answers."""
        self._payload = payload
        # Not waited for here: the worker's constructor returns at once, so that its
        # compile pool gets configs while this process still imports torch and sets up
        # the device. The first trial (or device_name) waits for it.
        self._adopt = adopt
        self._child = None if adopt else child.start("actors.launcher:serve", self._payload)
        self._ready = False
        self._device_name = ""
        self._starting = threading.Lock()  # info() and the first trial may both wait

    @property
    def device_name(self) -> str:
        return self.wait_ready()

    def wait_ready(self) -> str:
        with self._starting:
            return self._wait_ready()

    def _wait_ready(self) -> str:
        if self._child is None:
            self._child = self._adopted() or child.start("actors.launcher:serve", self._payload)
        if not self._ready:
            try:
                _, device_name = self._child.replies.recv()
            except (EOFError, OSError):
                raise RuntimeError("the kernel-launching process failed to start "
                                   f"({self._child.exit_text()})") from None
            self._ready = True
            self._device_name = device_name
        return self._device_name

    def _adopted(self) -> child.Child | None:
        assert self._adopt is not None
        address, key_hex, pid = self._adopt
        # It may not have made its socket yet (see ADOPT_WAIT_S).
        deadline = time.monotonic() + ADOPT_WAIT_S
        while not os.path.exists(address) and time.monotonic() < deadline and child.alive(pid):
            time.sleep(0.01)
        try:
            connection = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key_hex))
            connection.send(("adopt", os.getpid()))
        except (OSError, EOFError, AuthenticationError):
            return None  # gone, or adopted by another worker: start one of our own
        return child.Child(child.Foreign(lambda: pid), connection, connection)

    def _restart(self) -> None:
        if self._child is not None:
            child.kill(self._child)
        self._child = child.start("actors.launcher:serve", self._payload)
        self._ready = False

    def _call(self, op: str, *args: Any) -> tuple[str, Any]:
        self.wait_ready()
        process = self._child
        assert process is not None
        try:
            process.requests.send((op, args))
            kind, value = process.replies.recv()
        except (EOFError, OSError):
            why = process.exit_text()
            self._restart()
            raise LauncherDied(why) from None
        if kind == "poisoned":  # it has exited; the outcome it sent says why
            self._restart()
        return kind, value

    def run_trial(self, config: Mapping[str, Any],
                  compiled: Compiled | None = None) -> TrialOutcome:
        """A death may be no fault of the config (the launcher may have been killed from
        outside), so it gets a second launcher before it is recorded `crashed`."""
        deaths: list[str] = []
        while len(deaths) < 2:
            try:
                kind, value = self._call("trial", dict(config), compiled)
            except LauncherDied as e:
                deaths.append(str(e))
                continue
            if kind == "error":  # the backend maps kernel errors itself; this is a bug
                raise RuntimeError(value)
            return value
        return TrialOutcome("crashed", "skipped", error=clip_error(
            f"the process launching kernels died on this config twice ({', '.join(deaths)})"))

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> Retimed:
        kind, value = self._call("retime", [dict(c) for c in configs], rounds)
        if kind != "ok":
            raise RuntimeError(f"re-timing failed: {value}")
        return value
