"""Joining Ray and deciding where workers go: the backend that `auto` means on this
cluster, how many workers, and what each asks for."""

from __future__ import annotations

import os

import ray

from sweep.driver import Placement
from sweep.spec import Spec, SpecError


def connect(address: str | None) -> bool:
    """Join the cluster at address (or RAY_ADDRESS), else start a local instance.
    Returns whether this call started Ray (and so should stop it)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    common: dict = {"logging_level": "ERROR", "log_to_driver": False}
    if address:
        ray.init(address=address, **common)
        return True
    # A user's "module:attr" kernel next to the spec must import in the workers as it does
    # here (the CLI puts the working directory on sys.path, as uvicorn and pytest do). A
    # local instance's workers inherit this environment; setting it here rather than as a
    # runtime_env spares every worker Ray's runtime-env set-up.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, **common)
    return True


def resolve_backend(spec: Spec) -> str:
    requested = spec.run.backend
    if requested == "simulate":
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
