"""The local engine: a run's workers as processes of this machine (sweep/engines/local_runtime.py),
placed by what the machine has (sweep/engines/machine.py); nothing to start or to shut down."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from actors.backends import AUTO, resolve, traits
from actors.protocol import WorkerSettings
from storage.cache import library_versions
from sweep.engines import machine
from sweep.engines.local_runtime import LocalRuntime
from sweep.engines.placement import kinds_for
from sweep.engines.runtime import Placement
from sweep.spec import Spec, SpecError


class LocalEngine:
    """Workers as processes of this machine, placed by what it has (sweep/engines/machine.py)."""

    name = "local"

    def __init__(self) -> None:
        self._log: Path | None = None
        self._runtimes: list[LocalRuntime] = []
        self._gpus: dict[str, str] | None = None  # GPU id -> type, once asked

    def gpus(self) -> dict[str, str]:
        if self._gpus is None:
            self._gpus = {g: machine.gpu_type(name) if name else ""
                          for g, name in machine.gpus_by_id().items()}
        return self._gpus

    def on_this_machine(self) -> bool:
        return True

    def connect(self, stop_requested: Callable[[], bool], say: Callable[[str], None]) -> None:
        return None  # nothing to start: a worker is a process

    def resolve_backend(self, spec: Spec) -> str:
        requested = spec.run.backend
        if requested != AUTO and not traits(requested).gpu:
            return requested
        gpus = len(self.gpus())
        if requested != AUTO and gpus == 0:
            raise SpecError(f"{spec.path}: run.backend: cuda, but this machine has no GPU "
                            "(use auto or interpret to run on the CPU, or --address to "
                            "join a Ray cluster that has GPUs)")
        return resolve(requested, gpus)

    def placement(self, spec: Spec, backend: str) -> Placement:
        cap = spec.run.workers
        if backend == "simulate":
            if spec.simulate.resources:
                raise SpecError(f"{spec.path}: simulate.resources: asks Ray for resources, "
                                "and this run's runtime is local (run.runtime: ray, or "
                                "--address, runs it on Ray)")
            if spec.simulate.devices:
                kinds = kinds_for(spec, dict(spec.simulate.devices), cap, "simulated device")
                return Placement(workers=len(kinds), kinds=kinds)
            if spec.run.accelerator_types is not None:
                raise SpecError(f"{spec.path}: run.accelerator_types: the simulate backend's "
                                "device types are simulate.devices, and it names none")
            return Placement(workers=cap or spec.simulate.workers)
        if spec.run.accelerator_types is not None and not traits(backend).gpu:
            raise SpecError(f"{spec.path}: run.accelerator_types: chooses GPU types, but this "
                            f"run's backend is {backend}")
        if backend == "replay":
            return Placement(workers=cap or spec.replay.workers,
                             compile_workers=spec.replay.compile_slots)
        if backend == "cuda":
            gpus = self.gpus()
            available: dict[str, int] = {}
            for kind in gpus.values():
                available[kind] = available.get(kind, 0) + 1
            kinds = kinds_for(spec, available, cap, "GPU") \
                if len(available) > 1 or spec.run.accelerator_types is not None else ()
            # The machine's other CPUs compile ahead of its GPUs: one for each worker.
            per_gpu = machine.cpus() // max(len(gpus), 1)
            return Placement(workers=len(kinds) if kinds else min(cap or len(gpus), len(gpus)),
                             num_gpus=1, num_cpus=1, compile_workers=max(1, per_gpu - 1),
                             kinds=kinds)
        cpus = machine.cpus()
        return Placement(workers=min(cap or cpus, cpus), num_cpus=1,
                         env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})

    def device_names(self, kinds: Sequence[str], stop_requested: Callable[[], bool]
                     ) -> list[tuple[str, dict[str, str]]] | None:
        names = machine.gpus_by_id()
        here = library_versions()
        out = []
        for kind in kinds:
            name = next((n for g, n in names.items()
                         if not kind or self.gpus().get(g) == kind), "")
            if not name:
                return None
            out.append((name, here))
        return out

    def runtime(self, settings: WorkerSettings, placement: Placement,
                batches: int) -> LocalRuntime:
        runtime = LocalRuntime(settings, placement, self.gpus(), self._log)
        self._runtimes.append(runtime)
        return runtime

    def divert_reports(self, log: Path) -> None:
        self._log = log

    def mark_lost(self) -> None:
        return None  # this machine cannot be lost to itself

    def close(self) -> None:
        for runtime in self._runtimes:
            runtime.close()
        self._runtimes.clear()

