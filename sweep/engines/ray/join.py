"""Joining a Ray cluster that already runs: Ray would hang on an address that is silent and
print pages on one that refuses; here each ends in one line naming what gave the address."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from sweep.engines import machine
from sweep.engines.ray.tokens import no_token_here, refused_token
from sweep.engines.runtime import ConnectAbandoned
from sweep.spec import SpecError

CONNECT_TIMEOUT_S = 30.0  # to join an existing cluster; a local start has no such limit
PROBE_TIMEOUT_S = 3.0


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


def named_by(address: str | None) -> str:
    """What named the cluster being joined, for the first words of a refusal."""
    given = address or os.environ.get("RAY_ADDRESS") or "auto"
    if given == "auto":
        return "the Ray cluster found on this machine (`ray start`)"
    return "--address" if address else "RAY_ADDRESS"


def join(address: str, named: str, stop_requested: Callable[[], bool],
         common: dict[str, Any]) -> None:
    """ray.init on the cluster at address, refused in one line that begins with `named`."""

    def init() -> None:
        _probe(address, named)  # its name lookup, too, may take long
        ray.init(address=address, **common)

    _join_responsively(init, address, stop_requested, named)


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

    def run() -> None:
        try:
            init()
        except BaseException as e:  # handed to the main thread below
            failure.append(e)

    thread = threading.Thread(target=run, name="ray-connect", daemon=True)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    with _RaysStderr() as stderr:
        thread.start()
        while thread.is_alive():
            if stop_requested():
                raise ConnectAbandoned("stopped while joining the Ray cluster")
            if stderr.refused.is_set():
                raise SpecError(refused_token(address, named))
            if time.monotonic() >= deadline:
                raise SpecError(f"{named}: no Ray cluster answered at {address} within "
                                f"{CONNECT_TIMEOUT_S:g} s; is that the head's GCS port "
                                "(6379 by default)?")
            thread.join(0.1)
    if failure:
        e = failure[0]
        if type(e).__name__ == "AuthenticationError":  # ray.exceptions', before any call
            raise SpecError(no_token_here(named)) from None
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
