"""One Ray for this process, joined or started privately by connect() and shared by the
API's concurrent calls: one call's ray.shutdown() under another's sweep aborts Python."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from sweep.engines.ray import private as private_ray
from sweep.engines.ray.join import join, named_by, not_joined, target
from sweep.engines.ray.tokens import send_token_here
from sweep.spec import SpecError

# Where Ray's processes start: Ray puts the driver's working directory first on every
# worker's sys.path, where a user's own `storage/` or `actors/` folder would replace this
# project's packages. The directory holding this project's packages is safe there.
NEUTRAL_DIR = Path(__file__).resolve().parents[3]

_lost = threading.Event()


def mark_lost() -> None:
    """The cluster's GCS is gone: ray.shutdown() would wait on it (24 s, measured), and
    Ray's exit hook calls it again."""
    _lost.set()


def lost() -> bool:
    return _lost.is_set()


# --- one Ray for the sweep.api calls of one process ------------------------------------
# Calls on several threads share the Ray that the first of them connected: one call's
# ray.shutdown() under another's running sweep aborts the interpreter (a Check failure in
# Ray's core worker). The last of them to end shuts it down. The CLI, one call a process,
# connects and shuts down its own, as before.
_sharing = threading.local()  # .calls: API calls under way on this thread
_share_lock = threading.Lock()  # held while a shared Ray is connected or shut down
_users_lock = threading.Lock()  # for _users alone: a call ends without awaiting a connect
_users = 0  # API calls under way in this process
_ours: str | None = None  # the address that the calls' Ray was asked for, while it is up
_keeper: threading.Event | None = None  # set: the thread a local instance lives on ends


@contextlib.contextmanager
def shared_ray() -> Iterator[None]:
    """Around one API call: connect() inside it leaves Ray up for the process's other
    calls, and the last call to end shuts down the Ray that the calls connected (not one
    the caller connected itself)."""
    global _users
    with _users_lock:
        _users += 1
    _sharing.calls = getattr(_sharing, "calls", 0) + 1
    try:
        yield
    finally:
        _sharing.calls -= 1
        with _users_lock:
            _users -= 1
            last = _users == 0
        if last:
            # A call that began meanwhile counts: it connects after this, or shares.
            with _share_lock, _users_lock:
                if _users == 0:
                    _release()


def _release() -> None:
    global _ours, _keeper
    if _ours is not None and ray.is_initialized() and not lost():  # lost: it would wait
        ray.shutdown()
    _ours = None
    if _keeper is not None:
        _keeper.set()
        _keeper = None


def connect(address: str | None, stop_requested: Callable[[], bool],
            say: Callable[[str], None] = lambda message: None) -> bool:
    """_connect, or within shared_ray() the process's shared Ray: joined by the first
    call, and refused (SpecError) to a call that asks for another cluster meanwhile. Returns
    whether the caller should shut Ray down when done (within shared_ray(), never)."""
    global _ours, _keeper
    if not getattr(_sharing, "calls", 0):
        return _connect(address, stop_requested, say)
    asked = address or os.environ.get("RAY_ADDRESS") or "auto"
    with _share_lock:  # one call connects at a time: a second would start a second Ray
        if ray.is_initialized():
            if _ours is not None and asked != _ours:
                raise SpecError(f"address: {asked}, but another sweep.api call of this "
                                f"process is running on the Ray it asked for as {_ours}; "
                                "calls at the same time share one: give the same address, "
                                "or wait for that call to end")
            return False
        if threading.current_thread() is not threading.main_thread() and \
                starts_local(address):
            _keeper = _on_keeper(lambda: _connect(address, stop_requested, say))
        else:
            _connect(address, stop_requested, say)
        _ours = asked
    return False


def _on_keeper(start: Callable[[], object]) -> threading.Event:
    """start() (a local instance's start) on a thread that then lives until the event
    returned is set: Ray's processes die with the thread that started them
    (PR_SET_PDEATHSIG), and the call that started them may end, and its thread, while
    another call still runs on them."""
    started, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def keep() -> None:
        try:
            start()
        except BaseException as e:  # handed to the calling thread below
            failure.append(e)
        started.set()
        if not failure:
            release.wait()

    threading.Thread(target=keep, name="ray-keeper", daemon=True).start()
    started.wait()
    if failure:
        raise failure[0]
    return release


def _connect(address: str | None, stop_requested: Callable[[], bool],
             say: Callable[[str], None] = lambda message: None) -> bool:
    """Join the cluster target(address) names, else start a private local instance.
    Returns whether this call started or joined Ray (and so should shut it down)."""
    if ray.is_initialized():
        return False
    joining = target(address)
    common: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
    if joining is not None:
        if (address or os.environ.get("RAY_ADDRESS") or "auto") == "auto":
            token = send_token_here(joining)
            sending = f" with the token in {token}" if token else ""
            say(f"joining the Ray cluster started on this machine at {joining}{sending} "
                "(--address local starts a private one instead)")
        named = named_by(address)
        with _neutral_cwd():
            join(joining, named, stop_requested, common)
        return True
    why = not_joined(address)
    if why:
        say(why)
    with _neutral_cwd():
        private_ray.start(stop_requested, say, common)
    private_ray.mark_started()
    return True


def starts_local(address: str | None) -> bool:
    """Whether connect(address) will start a Ray instance on this machine."""
    if ray.is_initialized():
        return False
    try:
        return target(address) is None
    except SpecError:
        return False  # connect() reports it


@contextlib.contextmanager
def _neutral_cwd() -> Iterator[None]:
    here = os.getcwd()
    os.chdir(NEUTRAL_DIR)
    try:
        yield
    finally:
        os.chdir(here)


_reports_to: list[Path] = []  # where divert_ray_reports sends Ray's reports now


def divert_ray_reports(log: Path) -> None:
    """From now on, Ray's reports to this driver (the raylet's paragraph of a thousand
    characters on each worker that dies, which Ray prints on stdout) go to `log` instead
    of the terminal: the sweep says why each worker died in one line of its own. (A private
    hook of Ray's: where it is missing, Ray prints them as before.)"""
    _reports_to[:] = [log]
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "diverted", False):
        return

    def divert(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with contextlib.suppress(OSError, IndexError), \
                _reports_to[0].open("a", encoding="utf-8") as f:
            f.writelines(f"{stamp} {line}\n" for line in data.get("lines", []))

    divert.diverted = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = divert  # type: ignore[union-attr]

