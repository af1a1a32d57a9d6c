"""Joining Ray and deciding where workers go: the backend that `auto` means on this
cluster, how many workers, and what each asks for."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from sweep import SweepFailed
from sweep.engines import machine
from sweep.engines.placement import kinds_for
from sweep.engines.ray_runtime import TYPE_RESOURCE
from sweep.engines.runtime import ConnectAbandoned, Placement
from sweep.spec import Spec, SpecError

CONNECT_TIMEOUT_S = 30.0  # to join an existing cluster; a local start has no such limit
PROBE_TIMEOUT_S = 3.0
# A local start that times out (its raylet slow to register on a loaded machine, Ray's
# usual complaint there) is tried once more; any other failure would only repeat.
START_ATTEMPTS = 2
RAYLET_WAIT_S = 30  # Ray's own, not configurable (raylet_start_wait_time_s, node.py)

# Where Ray's processes start: Ray puts the driver's working directory first on every
# worker's sys.path, where a user's own `storage/` or `actors/` folder would replace this
# project's packages. The directory holding this project's packages is safe there.
NEUTRAL_DIR = Path(__file__).resolve().parents[2]


class RayStartFailed(SweepFailed):
    """The private local instance could not be started: one line of the sweep's own
    instead of Ray's traceback."""


class _Interrupted(BaseException):
    """Raised into ray.init by a stop signal while a local instance starts. Not an
    Exception, so that no `except Exception` in Ray's start-up swallows it."""


_lost = threading.Event()


def mark_lost() -> None:
    """The cluster's GCS is gone: ray.shutdown() would wait on it (24 s, measured), and
    Ray's exit hook calls it again."""
    _lost.set()


def lost() -> bool:
    return _lost.is_set()


_private = threading.Event()  # this process started a private local instance


def end_private_now() -> None:
    """SIGKILL every process of the private instance this process started (not a cluster
    it joined): the CLI's end, once everything is written, without ray.shutdown's
    handshake (2-3.5 s). Its GCS and raylet would die with this process anyway; the
    processes they started need not."""
    if _private.is_set():
        for pid in _rays_children(set()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


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
            token = _send_token_here(joining)
            sending = f" with the token in {token}" if token else ""
            say(f"joining the Ray cluster started on this machine at {joining}{sending} "
                "(--address local starts a private one instead)")
        named = _named_by(address)

        def join() -> None:
            _probe(joining, named)  # its name lookup, too, may take long
            ray.init(address=joining, **common)

        with _neutral_cwd():
            _join_responsively(join, joining, stop_requested, named)
        return True
    why = not_joined(address)
    if why:
        say(why)
    with _neutral_cwd(), _without_rays_sigterm_handler():
        _start_local(stop_requested, say, common)
    _private.set()
    return True


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
        before = set(_children().get(os.getpid(), []))
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
            while _parent(pid) == me and os.waitpid(pid, os.WNOHANG) == (0, 0) and \
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
        tree = _children()
        todo = [p for p in tree.get(os.getpid(), [])
                if p not in before and ray_dir in " ".join(_args(p))]
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


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                parent = _parent(int(name))
                if parent is not None:
                    tree.setdefault(parent, []).append(int(name))
    return tree


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _args(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _logs_named(pids: list[int]) -> Path | None:
    """The logs directory Ray gave its processes on their command lines."""
    for pid in pids:
        for arg in _args(pid):
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


def target(address: str | None) -> str | None:
    """The cluster a run joins: --address, else RAY_ADDRESS, else the one `ray start`
    began on this machine, if it still answers (as `ray` commands do). None: start a
    private local instance, which "local" asks for even when a cluster runs here; "auto"
    insists on the cluster found here."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address == "local":
        return None
    if address is not None and address != "auto":
        return address
    found = _started_here()
    if found is None and address == "auto":
        raise SpecError("--address auto: no Ray cluster started with `ray start` answers on "
                        "this machine; give the head's address, or leave --address out to "
                        "start a private one")
    return found


def starts_local(address: str | None) -> bool:
    """Whether connect(address) will start a Ray instance on this machine."""
    if ray.is_initialized():
        return False
    try:
        return target(address) is None
    except SpecError:
        return False  # connect() reports it


def _started_here() -> str | None:
    return machine.ray_head_here(PROBE_TIMEOUT_S, _address_file())


def _address_file() -> Path:
    return machine.ray_address_file()


def _record_owner(path: Path) -> int | None:
    """The user who wrote Ray's record of a cluster started here, if there is one."""
    try:
        return path.stat().st_uid
    except OSError:
        return None


def not_joined(address: str | None) -> str | None:
    """Why a run without an address starts a private Ray although `ray start` left a
    cluster's record on this machine: another user started it. None otherwise."""
    if address or os.environ.get("RAY_ADDRESS"):
        return None
    path = _address_file()
    owner = _record_owner(path)
    if owner is None or owner == os.getuid():
        return None
    try:
        import pwd

        who = pwd.getpwuid(owner).pw_name
    except (ImportError, KeyError):
        who = f"uid {owner}"
    return (f"a Ray cluster on this machine was started by another user ({who}, "
            f"{path}): not joining it; starting a private one (--address joins one "
            "explicitly)")


def _named_by(address: str | None) -> str:
    """What named the cluster being joined, for the first words of a refusal."""
    given = address or os.environ.get("RAY_ADDRESS") or "auto"
    if given == "auto":
        return "the Ray cluster found on this machine (`ray start`)"
    return "--address" if address else "RAY_ADDRESS"


def _probe(address: str, named: str = "--address") -> None:
    """Ray keeps retrying an address where nothing listens for many minutes, deaf to
    signals meanwhile: try a plain TCP connection first."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # "auto", a Ray Client address: Ray reports those itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise SpecError(f"{named}: cannot reach a Ray cluster at {address} ({why}); "
                        "is the head node up, and is that its GCS port (6379 by default)?"
                        ) from None


def _join_responsively(init: Callable[[], object], address: str,
                       stop_requested: Callable[[], bool], named: str = "--address") -> None:
    """ray.init in a thread, so that this one stays free to see a Ctrl+C or SIGTERM, and
    to give up on a cluster that does not answer."""
    failure: list[BaseException] = []

    def join() -> None:
        try:
            init()
        except BaseException as e:  # handed to the main thread below
            failure.append(e)

    thread = threading.Thread(target=join, name="ray-connect", daemon=True)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    with _RaysStderr() as stderr:
        thread.start()
        while thread.is_alive():
            if stop_requested():
                raise ConnectAbandoned("stopped while joining the Ray cluster")
            if stderr.refused.is_set():
                raise SpecError(_refused_token(address, named))
            if time.monotonic() >= deadline:
                raise SpecError(f"{named}: no Ray cluster answered at {address} within "
                                f"{CONNECT_TIMEOUT_S:g} s; is that the head's GCS port "
                                "(6379 by default)?")
            thread.join(0.1)
    if failure:
        e = failure[0]
        if type(e).__name__ == "AuthenticationError":  # ray.exceptions', before any call
            raise SpecError(_no_token_here(named)) from None
        if isinstance(e, ConnectionError):
            raise SpecError(f"{named}: cannot join the Ray cluster at {address} "
                            f"({str(e).splitlines()[0][:300]})") from None
        if isinstance(e, RuntimeError) and str(e).startswith("Version mismatch"):
            versions = " ".join(str(e).split())
            raise SpecError(f"{named}: the Ray cluster at {address} runs other versions "
                            f"than this process ({versions[:400]}); install the cluster's "
                            "Ray and Python here, or run sweep on the head node") from None
        raise e


class _RaysStderr:
    """While joining, fd 2 goes through a pipe. A cluster with token authentication that
    refuses this process's token (or its lack of one) shows only as a line Ray's C++ client
    logs on each of 20 tries over 20 s, before a ConnectionError that does not name the
    cause; here the first such line ends the wait, and none is shown. Every other line
    passes through. (After a refusal the thread still inside ray.init tries once a second
    until the process ends, which is sooner.)"""

    MARK = b"InvalidAuthToken"

    def __init__(self) -> None:
        self.refused = threading.Event()
        self._saved = -1
        self._reader: threading.Thread | None = None

    def __enter__(self) -> _RaysStderr:
        try:
            self._saved = os.dup(2)
            read_end, write_end = os.pipe()
        except OSError:  # no fd 2, or no fds left: join unfiltered
            if self._saved >= 0:
                os.close(self._saved)
            return self
        os.dup2(write_end, 2)
        os.close(write_end)
        self._reader = threading.Thread(target=self._pass, args=(read_end, self._saved),
                                        name="ray-stderr", daemon=True)
        self._reader.start()
        return self

    def _pass(self, read_end: int, saved: int) -> None:
        """Until the pipe's end; then this thread closes the saved fd, which it writes to:
        closed any earlier, its number could be reused by a file opened meanwhile."""
        try:
            with os.fdopen(read_end, "rb") as lines:
                for line in lines:
                    if self.MARK in line:
                        self.refused.set()
                    else:
                        with contextlib.suppress(OSError):
                            os.write(saved, line)
        finally:
            os.close(saved)

    def __exit__(self, *exc: object) -> None:
        if self._reader is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # closes the pipe's write end: the reader ends
        self._reader.join(1.0)  # what is still in the pipe goes out before we go on


def _no_token_here(named: str = "--address") -> str:
    """Ray in token mode (RAY_AUTH_MODE=token) found no token to send."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    looked = f"{path} (RAY_AUTH_TOKEN_PATH) does not hold one" if path else \
        "neither RAY_AUTH_TOKEN nor ~/.ray/auth_token holds one"
    return (f"{named}: RAY_AUTH_MODE=token, but this machine has no token ({looked}); "
            "set RAY_AUTH_TOKEN to the cluster's token or put it in ~/.ray/auth_token "
            "(`ray get-auth-token` on the head prints it)")


def _refused_token(address: str, named: str = "--address") -> str:
    where = _token_here()
    head = f"{named}: the Ray cluster at {address} uses token authentication"
    if where is None:
        return (f"{head} and this machine has no token; set RAY_AUTH_MODE=token and "
                "RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on the head "
                "prints it), or put it in ~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        # Ray sends a token to an address given explicitly only in token mode.
        return (f"{head}; a token is in {where}, but Ray sends it only with "
                "RAY_AUTH_MODE=token: set that too")
    return (f"{head} and refused the token in {where}; use the cluster's token "
            "(`ray get-auth-token` on the head prints it)")


def _token_here() -> str | None:
    """Where the token Ray would send from this process is, as Ray looks for one:
    RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names (Ray looks no further when it
    is set), else ~/.ray/auth_token; a blank value or file holds none. None: no token."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    file = Path(path).expanduser() if path else Path.home() / ".ray" / "auth_token"
    try:
        if not file.read_text(errors="replace").strip():
            return None
    except OSError:
        return None
    return f"{path} (RAY_AUTH_TOKEN_PATH)" if path else str(file)


def _send_token_here(address: str) -> str | None:
    """For the cluster `ray start` began on this machine, what Ray's own ray.init()
    without an address does (sweep hands ray.init the address it found, and Ray sends a
    token to an address only in token mode): with RAY_AUTH_MODE unset and a token here,
    turn token mode on for this process, unless the head is seen to run without token
    authentication. Returns where the token is, for the first line (~ for the default
    file); None: nothing changed. A head with another token refuses this one, in one line
    (_refused_token); a head that cannot be told counts as one with token authentication,
    since one without accepts a token sent all the same (Ray 2.60)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:  # the user's choice, as Ray keeps it
        return None
    where = _token_here()
    if where is None or _head_uses_token(address) is False:
        return None
    os.environ["RAY_AUTH_MODE"] = "token"
    config = getattr(getattr(ray, "_raylet", None), "Config", None)
    if config is not None:  # Ray reads RAY_AUTH_MODE once, at import: read it again
        config.initialize("")
    default = Path.home() / ".ray" / "auth_token"
    return "~/.ray/auth_token" if where == str(default) else where


def _head_uses_token(address: str) -> bool | None:
    """Whether the head at address, started on this machine by this user, runs with
    token authentication: its GCS server's environment says (RAY_AUTH_MODE, which `ray
    start` sets to token where a token exists, and which Ray's servers read when they
    start; the GCS is found by the port on its command line). None where that cannot be
    told: no such process to be seen here (a head in another PID namespace, or started
    with --port 0), or no RAY_AUTH_MODE there (Ray's default mode then)."""
    port = address.rpartition(":")[2]
    if not port.isdigit():
        return None
    flag, me = f"--gcs_server_port={int(port)}", os.getuid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        args = _args(pid)
        if not args or os.path.basename(args[0]) != "gcs_server" or flag not in args:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        mode = next((v.partition(b"=")[2].decode(errors="replace").strip().lower()
                     for v in environ if v.startswith(b"RAY_AUTH_MODE=")), None)
        return {"token": True, "disabled": False}.get(mode or "")
    return None


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


def resolve_backend(spec: Spec) -> str:
    requested = spec.run.backend
    if requested in ("simulate", "replay"):
        return requested
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if requested == "cuda" and gpus == 0:
        raise SpecError(f"{spec.path}: run.backend: cuda, but the Ray cluster has no GPU "
                        "(use auto or interpret to run on the CPU)")
    if requested == "auto":
        return "cuda" if gpus > 0 else "interpret"
    return requested


def device_types() -> dict[str, int]:
    """GPUs per accelerator type on the cluster's live nodes, by the resource Ray labels
    such a node with (`accelerator_type:H100`); "" for GPUs of a node without one."""
    counts: dict[str, int] = {}
    for node in ray.nodes():
        resources = node.get("Resources", {}) if node.get("Alive") else {}
        gpus = int(resources.get("GPU", 0))
        if gpus:
            label = next((k[len(TYPE_RESOURCE):] for k in resources
                          if k.startswith(TYPE_RESOURCE)), "")
            counts[label] = counts.get(label, 0) + gpus
    return counts


def gpu_names(kinds: list[str], stop_requested: Callable[[], bool] = lambda: False,
              timeout_s: float = 60.0) -> list[tuple[str, dict[str, str]]] | None:
    """The CUDA device name of a GPU of each kind ("": any GPU), as torch reports it on
    one (the trial table's `device`), and the torch and Triton versions there (a head
    may have other builds): the best-config cache's key. Asked of a short task there;
    None if one did not answer in time (its GPUs busy) or a stop came first. Ray's
    accelerator type cannot stand in for the name: H100 SXM, PCIe and NVL GPUs are all
    `H100`."""

    # max_calls=1: the worker exits afterwards, and its CUDA context with it.
    name = ray.remote(num_gpus=0.01, num_cpus=0, max_calls=1)(_identity)

    def ask(kind: str) -> Any:
        resources = {f"{TYPE_RESOURCE}{kind}": 0.001} if kind else {}
        return name.options(resources=resources).remote()

    asked = [ask(kind) for kind in kinds]
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not stop_requested():
            done, _ = ray.wait(asked, num_returns=len(asked), timeout=0.1)
            if len(done) == len(asked):
                return list(ray.get(asked))
    except ray.exceptions.RayError:  # a task that failed
        pass
    for ref in asked:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.cancel(ref, force=True)
    return None


def _identity() -> tuple[str, dict[str, str]]:
    from storage.cache import library_versions

    return _device_name(), library_versions()


def _device_name() -> str:
    """A node whose GPUs differ asks torch about the one Ray gave the task."""
    names = machine.smi_names()
    if names is not None and len(set(names)) == 1:
        return names[0]
    import torch

    return str(torch.cuda.get_device_name(0))


def labelled_types() -> set[str]:
    """The accelerator types some node of the cluster is labelled with."""
    return {k[len(TYPE_RESOURCE):] for k in ray.cluster_resources()
            if k.startswith(TYPE_RESOURCE)}


def placement(spec: Spec, backend: str) -> Placement:
    cap = spec.run.workers
    if backend == "simulate":
        if spec.simulate.devices:
            kinds = kinds_for(spec, dict(spec.simulate.devices), cap, "simulated device")
            return Placement(workers=len(kinds), num_cpus=0, kinds=kinds,
                             resources=spec.simulate.resources)
        if spec.run.accelerator_types is not None:
            raise SpecError(f"{spec.path}: run.accelerator_types: the simulate backend's "
                            "device types are simulate.devices, and it names none")
        return Placement(workers=cap or spec.simulate.workers, num_cpus=0,
                         resources=spec.simulate.resources)
    if spec.run.accelerator_types is not None and backend != "cuda":
        raise SpecError(f"{spec.path}: run.accelerator_types: chooses GPU types, but this "
                        f"run's backend is {backend}" + (" (the Ray cluster has no GPU yet?)"
                                                         if backend == "interpret" else ""))
    if backend == "replay":
        return Placement(workers=cap or spec.replay.workers, num_cpus=0,
                         compile_workers=spec.replay.compile_slots)
    resources = ray.cluster_resources()
    if backend == "cuda":
        gpus = int(resources.get("GPU", 0))
        # The node's other CPUs compile ahead of its GPUs: one for each worker itself.
        per_gpu = int(resources.get("CPU", 1)) // max(gpus, 1)
        available = device_types()
        # One type, and no choice among types: workers go wherever a GPU is free.
        kinds = kinds_for(spec, available, cap, "GPU") \
            if len(available) > 1 or spec.run.accelerator_types is not None else ()
        return Placement(workers=len(kinds) if kinds else min(cap or gpus, gpus),
                         num_gpus=1, num_cpus=1, compile_workers=max(1, per_gpu - 1),
                         kinds=kinds)
    cpus = max(1, int(resources.get("CPU", 1)))
    return Placement(workers=min(cap or cpus, cpus), num_cpus=1,
                     env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
