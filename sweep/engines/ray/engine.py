"""The Ray engine: a run's workers as actors of a Ray cluster, joined or started
(sweep/engines/ray/cluster.py), driven through RayRuntime (sweep/engines/ray/runtime.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from actors.protocol import WorkerSettings
from sweep.engines.ray import cluster
from sweep.engines.ray import placement as ray_placement
from sweep.engines.ray.runtime import RayRuntime
from sweep.engines.runtime import Placement
from sweep.spec import Spec


class RayEngine:
    name = "ray"

    def __init__(self, address: str | None, shut_down: bool = True) -> None:
        """address: as --address takes it (None: RAY_ADDRESS, a head started here, else a
        private instance). shut_down: the Ray is shared with the process's other calls
        (the Python API's, several threads at once), and the last of them to end shuts
        down the one they connected (cluster.shared_ray); the CLI passes False and ends
        its process without waiting on Ray's shutdown."""
        self.address = address
        self.shut_down = shut_down
        self._sharing: contextlib.AbstractContextManager[None] | None = None

    def on_this_machine(self) -> bool:
        return cluster.starts_local(self.address)

    def connect(self, stop_requested: Callable[[], bool], say: Callable[[str], None]) -> None:
        if self.shut_down and self._sharing is None:
            self._sharing = cluster.shared_ray()
            self._sharing.__enter__()
        cluster.connect(self.address, stop_requested, say)

    def resolve_backend(self, spec: Spec) -> str:
        return ray_placement.resolve_backend(spec)

    def placement(self, spec: Spec, backend: str) -> Placement:
        return ray_placement.placement(spec, backend)

    def device_names(self, kinds: Sequence[str], stop_requested: Callable[[], bool]
                     ) -> list[tuple[str, dict[str, str]]] | None:
        return ray_placement.gpu_names(list(kinds), stop_requested)

    def runtime(self, settings: WorkerSettings, placement: Placement,
                batches: int) -> RayRuntime:
        return RayRuntime(settings, placement, batches, ray_placement.labelled_types())

    def divert_reports(self, log: Path) -> None:
        cluster.divert_ray_reports(log)

    def mark_lost(self) -> None:
        cluster.mark_lost()

    def close(self) -> None:
        if self._sharing is not None:  # the last call to end shuts Ray down
            sharing, self._sharing = self._sharing, None
            sharing.__exit__(None, None, None)
