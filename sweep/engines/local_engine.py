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
from sweep.engines.placement import Inventory, place
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
        gpus = self.gpus() if backend == "cuda" else {}
        types: dict[str, int] = {}
        for kind in gpus.values():
            types[kind] = types.get(kind, 0) + 1
        return place(spec, backend, Inventory(gpus=len(gpus), types=types, cpus=machine.cpus()))

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

