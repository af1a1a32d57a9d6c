"""A private Ray instance on this machine, started and ended by this process: Ray's start
can hang, fail or be stopped midway, and leaves behind whatever it had started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from sweep import SweepFailed
from sweep.engines.ray import procfs
from sweep.engines.runtime import ConnectAbandoned

# A local start that times out (its raylet slow to register on a loaded machine, Ray's
# usual complaint there) is tried once more; any other failure would only repeat.
START_ATTEMPTS = 2
RAYLET_WAIT_S = 30  # Ray's own, not configurable (raylet_start_wait_time_s, node.py)


class RayStartFailed(SweepFailed):
    """The private local instance could not be started: one line of the sweep's own
    instead of Ray's traceback."""


class _Interrupted(BaseException):
    """Raised into ray.init by a stop signal while a local instance starts. Not an
    Exception, so that no `except Exception` in Ray's start-up swallows it."""


_private = threading.Event()  # this process started a private local instance


def mark_started() -> None:
    """From now on end_private_now ends what start() began: the caller says so once its
    start is complete, its working directory back."""
    _private.set()


def end_private_now() -> None:
    """SIGKILL every process of the private instance this process started (not a cluster
    it joined): the CLI's end, once everything is written, without ray.shutdown's
    handshake (2-3.5 s). Its GCS and raylet would die with this process anyway; the
    processes they started need not."""
    if _private.is_set():
        for pid in _rays_children(set()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def start(stop_requested: Callable[[], bool], say: Callable[[str], None],
          common: dict[str, Any]) -> None:
    """Start a private instance on this thread, this process's SIGTERM handler kept."""
    with _without_rays_sigterm_handler():
        _start_local(stop_requested, say, common)


def _start_local(stop_requested: Callable[[], bool], say: Callable[[str], None],
                 common: dict[str, Any]) -> None:
    """Start a private instance on this thread: Ray's processes die with the thread that
    starts them (PR_SET_PDEATHSIG), so nothing can wait beside ray.init here. On the main
    thread a stop signal raises into it instead (see _stoppable): a flag alone waited out
    the whole start (11-33 s on a loaded machine). What a start that fails or is stopped
    midway had started is ended here: Ray leaves it running."""
    for attempt in range(1, START_ATTEMPTS + 1):
        if stop_requested():  # a signal before the start, or the spec's mistake
            raise ConnectAbandoned("stopped before the run started")
        before = set(procfs.children().get(os.getpid(), []))
        try:
            with _stoppable(stop_requested) as started:
                # "local": Ray would otherwise look for a cluster of its own accord (and
                # refuse num_cpus for one it found).
                ray.init(address="local", num_cpus=os.cpu_count() or 1,
                         include_dashboard=False, **common)
                started()
            return
        except _Interrupted:
            _end_start(before)
            raise ConnectAbandoned("stopped before the run started") from None
        except KeyboardInterrupt:  # an API caller's second Ctrl+C: leave no Ray half up
            _end_start(before)
            raise
        except Exception as e:  # Ray's own failure to start, whatever its type
            logs = _end_start(before)
            if stop_requested():  # a SIGTERM to the process group ended Ray's processes too
                raise ConnectAbandoned("stopped before the run started") from None
            timed_out, why = _why_start_failed(e)
            where = f"; Ray's logs: {logs}" if logs else ""
            if timed_out and attempt < START_ATTEMPTS:
                say(f"Ray's local start timed out: {why}; trying once more")
                continue
            if timed_out:
                raise RayStartFailed(
                    f"Ray's local start timed out{' again' if attempt > 1 else ''}: {why}; "
                    "the machine may be too busy: try again when it is quieter, or start "
                    f"Ray once with `ray start --head`, which sweep then joins{where}"
                ) from None
            raise RayStartFailed(f"Ray's local start failed: {why}{where}") from None


def _why_start_failed(e: Exception) -> tuple[bool, str]:
    """Whether Ray's start timed out, and why it failed, in one clause: Ray's message
    for the two timeouts is a paragraph or a path of no use to the user."""
    text = " ".join(str(e).split())
    if "timed out during startup" in text:
        return True, (f"its raylet did not register with its GCS within the "
                      f"{RAYLET_WAIT_S} s Ray allows")
    if text.startswith("Timed out waiting for file") and "gcs_server_port" in text:
        wait = os.environ.get("RAY_gcs_server_port_wait_time_s", "30")  # noqa: SIM112
        return True, (f"its GCS server did not come up within the {wait} s that "
                      "RAY_gcs_server_port_wait_time_s allows")
    first = re.split(r"(?<=\.) ", text, maxsplit=1)[0][:300]
    return "timed out" in text.lower(), first or type(e).__name__


@contextlib.contextmanager
def _stoppable(stop_requested: Callable[[], bool]) -> Iterator[Callable[[], None]]:
    """While ray.init starts Ray on the main thread: a SIGINT or SIGTERM goes to the
    handler installed before (the StopController's, which records the stop, or on a
    second signal exits or raises KeyboardInterrupt), then, if that asked for a stop,
    raises _Interrupted, once. The call yielded disarms it when ray.init has returned:
    from then on a signal only sets the stop flag."""
    armed = threading.current_thread() is threading.main_thread()
    previous: dict[int, Callable[[int, Any], Any]] = {}

    def handle(signum: int, frame: Any) -> None:
        nonlocal armed
        previous[signum](signum, frame)
        if armed and stop_requested():
            armed = False
            raise _Interrupted

    def disarm() -> None:
        nonlocal armed
        armed = False

    if armed:
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if callable(handler):  # SIG_DFL and SIG_IGN keep their meaning
                previous[signum] = handler
                signal.signal(signum, handle)
    try:
        yield disarm
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _end_start(before: set[int]) -> Path | None:
    """End what an unfinished ray.init started (the GCS, the dashboard, the raylet and
    what those started), and return its session's logs directory if one shows. Ray ends
    them itself only once its start got as far as knowing them."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    if getattr(worker, "_global_node", None) is not None:
        with contextlib.suppress(Exception):
            ray.shutdown()
    found = _rays_children(before)
    logs = _logs_named(found) or _session_logs()
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    me = os.getpid()
    for pid in found:  # reap this process's own children, lest they linger as zombies
        with contextlib.suppress(OSError):
            while procfs.parent(pid) == me and os.waitpid(pid, os.WNOHANG) == (0, 0) and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
    return logs


def _rays_children(before: set[int]) -> list[int]:
    """This process's children since `before` that run Ray's code, and all under them,
    each stopped (SIGSTOP) as it is found, so that none starts another unseen. (Linux's
    /proc; elsewhere none are found, and PR_SET_PDEATHSIG ends them with this process.)"""
    ray_dir = os.path.dirname(ray.__file__)
    found: list[int] = []
    while True:
        tree = procfs.children()
        todo = [p for p in tree.get(os.getpid(), [])
                if p not in before and ray_dir in " ".join(procfs.args(p))]
        new = []
        while todo:
            p = todo.pop()
            new.append(p)
            todo += tree.get(p, [])
        new = [p for p in new if p not in found]
        if not new:
            return found
        for p in new:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGSTOP)
        found += new


def _logs_named(pids: list[int]) -> Path | None:
    """The logs directory Ray gave its processes on their command lines."""
    for pid in pids:
        for arg in procfs.args(pid):
            name, _, value = arg.partition("=")
            if name in ("--log_dir", "--logs-dir") and value:
                return Path(value)
            if name in ("--session-dir", "--session_dir") and value:
                return Path(value) / "logs"
    return None


def _session_logs() -> Path | None:
    """This process's session directory under Ray's temporary one (session_..._PID)."""
    utils = getattr(getattr(ray, "_common", None), "utils", None)
    temp = getattr(utils, "get_default_ray_temp_dir", None)  # a private helper of Ray's
    if temp is None:
        return None
    with contextlib.suppress(OSError):
        mine = sorted(Path(temp()).glob(f"session_*_{os.getpid()}"),
                      key=lambda p: p.stat().st_mtime)
        if mine:
            return mine[-1] / "logs"
    return None


@contextlib.contextmanager
def _without_rays_sigterm_handler() -> Iterator[None]:
    """ray.init replaces the SIGTERM handler with sys.exit; raised inside Ray's start-up
    that ended the process with a C++ abort (exit 1) instead of a clean stop. Ours stays
    installed instead. (A private hook of Ray: where it is missing, nothing changes.)"""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "set_sigterm_handler", None)
    if original is None:
        yield
        return
    utils.set_sigterm_handler = lambda handler: None  # type: ignore[union-attr]
    try:
        yield
    finally:
        utils.set_sigterm_handler = original  # type: ignore[union-attr]
