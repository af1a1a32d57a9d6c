"""Where a run's workers go: one rule for both engines, over the inventory each builds
(this machine's devices, sweep/engines/local_engine.py; the Ray cluster's,
sweep/engines/ray/placement.py): how many workers, and what each asks for."""

from __future__ import annotations

from dataclasses import dataclass

from actors.backends import traits
from sweep.engines.runtime import Placement
from sweep.spec import Spec, SpecError

INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Inventory:
    """What an engine has to place workers on."""

    gpus: int
    types: dict[str, int]  # GPUs per device type ("" for a GPU of no known type)
    cpus: int
    ray: bool = False  # the workers are Ray's, which simulate.resources are asked of


def place(spec: Spec, backend: str, inventory: Inventory) -> Placement:
    cap = spec.run.workers
    if backend == "simulate":
        if spec.simulate.resources and not inventory.ray:
            raise SpecError(f"{spec.path}: simulate.resources: asks Ray for resources, "
                            "and this run's runtime is local (run.runtime: ray, or "
                            "--address, runs it on Ray)")
        if spec.simulate.devices:
            kinds = kinds_for(spec, dict(spec.simulate.devices), cap, "simulated device")
            return Placement(workers=len(kinds), kinds=kinds, resources=spec.simulate.resources)
        if spec.run.accelerator_types is not None:
            raise SpecError(f"{spec.path}: run.accelerator_types: the simulate backend's "
                            "device types are simulate.devices, and it names none")
        return Placement(workers=cap or spec.simulate.workers, resources=spec.simulate.resources)
    if spec.run.accelerator_types is not None and not traits(backend).gpu:
        hint = " (the Ray cluster has no GPU yet?)" \
            if inventory.ray and traits(backend).interpreted else ""
        raise SpecError(f"{spec.path}: run.accelerator_types: chooses GPU types, but this "
                        f"run's backend is {backend}{hint}")
    if backend == "replay":
        return Placement(workers=cap or spec.replay.workers,
                         compile_workers=spec.replay.compile_slots)
    if backend == "cuda":
        gpus = inventory.gpus
        # One type, and no choice among types: workers go wherever a GPU is free.
        kinds = kinds_for(spec, inventory.types, cap, "GPU") \
            if len(inventory.types) > 1 or spec.run.accelerator_types is not None else ()
        # The other CPUs compile ahead of the GPUs: one for each worker itself.
        per_gpu = inventory.cpus // max(gpus, 1)
        return Placement(workers=len(kinds) if kinds else min(cap or gpus, gpus),
                         num_gpus=1, num_cpus=1, compile_workers=max(1, per_gpu - 1),
                         kinds=kinds)
    cpus = max(1, inventory.cpus)
    return Placement(workers=min(cap or cpus, cpus), num_cpus=1, env=dict(INTERPRETER_ENV))


def kinds_for(spec: Spec, available: dict[str, int], cap: int | None, what: str
              ) -> tuple[str, ...]:
    """A device type per worker: every type the spec allows, a worker per device of it,
    at most `cap` in all, taken from the types in turn (a cap keeps every type)."""
    allowed = spec.run.accelerator_types
    if allowed is not None:
        missing = [t for t in allowed if t not in available]
        if len(missing) == len(allowed):
            has = ", ".join(f"{t or 'unlabelled'} x{n}" for t, n in sorted(available.items()))
            raise SpecError(f"{spec.path}: run.accelerator_types: the cluster has no "
                            f"{what} of type {', '.join(allowed)} (it has: {has or 'none'})")
    counts = {t: n for t, n in sorted(available.items()) if allowed is None or t in allowed}
    kinds = [t for k in range(max(counts.values(), default=0)) for t, n in counts.items()
             if k < n]
    return tuple(sorted(kinds[:cap] if cap else kinds))
