"""Where a run's workers go on the Ray cluster it joined: the backend `auto` means there,
how many workers, and what each asks for, from what the cluster's nodes have."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import ray

from actors.backends import AUTO, resolve, traits
from sweep.engines import machine
from sweep.engines.placement import kinds_for
from sweep.engines.ray.runtime import TYPE_RESOURCE
from sweep.engines.runtime import Placement
from sweep.spec import Spec, SpecError


def resolve_backend(spec: Spec) -> str:
    requested = spec.run.backend
    if requested != AUTO and traits(requested).made_up_devices:
        return requested
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if requested != AUTO and traits(requested).gpu and gpus == 0:
        raise SpecError(f"{spec.path}: run.backend: cuda, but the Ray cluster has no GPU "
                        "(use auto or interpret to run on the CPU)")
    return resolve(requested, gpus)


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
    if spec.run.accelerator_types is not None and not traits(backend).gpu:
        raise SpecError(f"{spec.path}: run.accelerator_types: chooses GPU types, but this "
                        f"run's backend is {backend}" + (" (the Ray cluster has no GPU yet?)"
                                                         if traits(backend).interpreted else ""))
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
