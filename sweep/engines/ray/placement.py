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
from sweep.engines.placement import Inventory, place
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
    resources = ray.cluster_resources()
    return place(spec, backend, Inventory(gpus=int(resources.get("GPU", 0)),
                                          types=device_types() if backend == "cuda" else {},
                                          cpus=int(resources.get("CPU", 1)), ray=True))
