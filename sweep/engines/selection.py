"""Which engine runs a sweep's workers: the local one (processes of this machine) unless
a Ray cluster is named or found, or `run.runtime` / `--runtime` chooses. Imports neither
engine until it is chosen: a run on the local one never imports Ray."""

from __future__ import annotations

import importlib.util
import os
import sys

from sweep.engines import machine
from sweep.engines.runtime import Engine
from sweep.spec import RUNTIMES, SpecError

# How long a head recorded on this machine may take to answer: it is this machine's own, so
# one that does not answer at once is not up (its record outlived it).
HEAD_PROBE_S = 0.5
RAY_EXTRA = "'triton-sweep[ray]'"  # from a clone: pip install -e '.[ray]'


def wanted(asked: str | None, spec_runtime: str, address: str | None,
           callers_ray: bool = False) -> str:
    """"local" or "ray". asked: --runtime (or the API's runtime=), over the spec's
    run.runtime; auto: Ray where --address, RAY_ADDRESS or a `ray start` head on this
    machine (started by this user, answering) names a cluster, or where this process has
    connected Ray already (callers_ray: the Python API's caller), else local."""
    if asked is not None and asked not in RUNTIMES:
        raise SpecError(f"--runtime: expected one of {', '.join(RUNTIMES)}, got {asked!r}")
    chosen = asked if asked is not None else spec_runtime
    if chosen == "local":
        if address:
            raise SpecError(f"--address {address}: names a Ray cluster, but the runtime is "
                            "local (--runtime / run.runtime); pass --runtime ray, or leave "
                            "--address out")
        return "local"
    ray = sys.modules.get("ray") if callers_ray else None
    if ray is not None and ray.is_initialized():
        return "ray"
    why = ("--runtime ray" if asked == "ray" else "run.runtime: ray" if chosen == "ray"
           else f"--address {address}" if address
           else f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS")
           else "--runtime auto found a Ray head on this machine (`ray start`); joining it"
           if machine.ray_head_here(HEAD_PROBE_S) is not None else None)
    if why is None:
        return "local"
    check_ray_installed(why)
    return "ray"


def check_ray_installed(why: str) -> None:
    """Ray is an extra (one machine needs none of it): where it is wanted and missing, say
    what to install, in one line, before anything starts. why: what asks for Ray."""
    try:
        there = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        there = False
    if not there:
        raise SpecError(f"{why}: needs Ray, which is not installed; pip install "
                        f"{RAY_EXTRA}, or --runtime local to run on this machine without it")


def choose(asked: str | None, spec_runtime: str, address: str | None,
           shut_down: bool = True, callers_ray: bool = False) -> Engine:
    """The engine wanted() names. shut_down: see RayEngine."""
    if wanted(asked, spec_runtime, address, callers_ray) == "local":
        from sweep.engines.local_engine import LocalEngine

        return LocalEngine()
    from sweep.engines.ray.engine import RayEngine

    return RayEngine(address, shut_down=shut_down)
