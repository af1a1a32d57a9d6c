"""Joining Ray and deciding where workers go: the backend that `auto` means on this
cluster, how many workers, and what each asks for."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from sweep.runtime import Placement
from sweep.spec import Spec, SpecError

CONNECT_TIMEOUT_S = 30.0  # to join an existing cluster; a local start has no such limit
PROBE_TIMEOUT_S = 3.0

# Where Ray's processes start: Ray puts the driver's working directory first on every
# worker's sys.path, where a user's own `storage/` or `actors/` folder would replace this
# project's packages. The directory holding this project's packages is safe there.
NEUTRAL_DIR = Path(__file__).resolve().parent.parent


class ConnectAbandoned(Exception):
    """A stop was asked for, or the cluster did not answer, while Ray was still joining
    it; the thread inside ray.init cannot be interrupted and is left behind."""


_abandoned = threading.Event()


def abandoned() -> bool:
    """Whether a ray.init was left running in a thread: the process must then end with
    os._exit, since Ray's exit hooks could wait on it."""
    return _abandoned.is_set()


def connect(address: str | None, stop_requested: Callable[[], bool]) -> bool:
    """Join the cluster at address (or RAY_ADDRESS), else start a local instance.
    Returns whether this call started Ray (and so should stop it)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    common: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
    if address:
        def join() -> None:
            _probe(address)  # its name lookup, too, may take long
            ray.init(address=address, **common)

        with _neutral_cwd():
            _join_responsively(join, address, stop_requested)
        return True
    # Ray's processes die with the thread that starts them (PR_SET_PDEATHSIG), so a local
    # instance starts on this, the main thread; a signal meanwhile only sets the stop flag.
    with _neutral_cwd(), _without_rays_sigterm_handler():
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, **common)
    return True


def starts_local(address: str | None) -> bool:
    """Whether connect(address) will start a Ray instance on this machine."""
    return not (ray.is_initialized() or address or os.environ.get("RAY_ADDRESS"))


def _probe(address: str) -> None:
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
        raise SpecError(f"--address: cannot reach a Ray cluster at {address} ({why}); "
                        "is the head node up, and is that its GCS port (6379 by default)?"
                        ) from None


def _join_responsively(init: Callable[[], object], address: str,
                       stop_requested: Callable[[], bool]) -> None:
    """ray.init in a thread, so that this one stays free to see a Ctrl+C or SIGTERM, and
    to give up on a cluster that does not answer."""
    failure: list[BaseException] = []

    def join() -> None:
        try:
            init()
        except BaseException as e:  # handed to the main thread below
            failure.append(e)

    thread = threading.Thread(target=join, name="ray-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while thread.is_alive():
        if stop_requested():
            _abandoned.set()
            raise ConnectAbandoned("stopped while joining the Ray cluster")
        if time.monotonic() >= deadline:
            _abandoned.set()
            raise SpecError(f"--address: no Ray cluster answered at {address} within "
                            f"{CONNECT_TIMEOUT_S:g} s; is that the head's GCS port "
                            "(6379 by default)?")
        thread.join(0.1)
    if failure:
        e = failure[0]
        if isinstance(e, ConnectionError):
            raise SpecError(f"--address: cannot join the Ray cluster at {address} "
                            f"({str(e).splitlines()[0][:300]})") from None
        raise e


@contextlib.contextmanager
def _neutral_cwd() -> Iterator[None]:
    here = os.getcwd()
    os.chdir(NEUTRAL_DIR)
    try:
        yield
    finally:
        os.chdir(here)


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


def placement(spec: Spec, backend: str) -> Placement:
    cap = spec.run.workers
    if backend == "simulate":
        return Placement(workers=cap or spec.simulate.workers, num_cpus=0)
    if backend == "replay":
        return Placement(workers=cap or spec.replay.workers, num_cpus=0,
                         compile_workers=spec.replay.compile_slots)
    resources = ray.cluster_resources()
    if backend == "cuda":
        gpus = int(resources.get("GPU", 0))
        # The node's other CPUs compile ahead of its GPUs: one for each worker itself.
        per_gpu = int(resources.get("CPU", 1)) // max(gpus, 1)
        return Placement(workers=min(cap or gpus, gpus), num_gpus=1, num_cpus=1,
                         compile_workers=max(1, per_gpu - 1))
    cpus = max(1, int(resources.get("CPU", 1)))
    return Placement(workers=min(cap or cpus, cpus), num_cpus=1,
                     env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
