"""The trial worker: a Ray actor that owns one GPU (or one CPU for the interpreter, or one
simulated GPU) and runs the trials the driver hands it, streaming a record per trial.

run() is a Ray generator, so the driver sees each trial finish as it happens: it knows
which trial is running (the one after the last record) and since when, which is what a
per-trial timeout and the blame for a dead worker need.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from storage.records import TrialOutcome, TrialRecord


@dataclass(frozen=True)
class BatchStarted:
    """The worker began a batch; the first trial's clock starts now, not at submission."""


@dataclass(frozen=True)
class Retire:
    """This worker's process is unusable (a sticky CUDA error): replace it. The trial that
    caused it was already recorded; the rest of the batch goes back to the queue."""

    reason: str


WorkerMessage = BatchStarted | TrialRecord | Retire


class Backend(Protocol):
    device_name: str

    def run_trial(self, config: Mapping[str, Any]) -> TrialOutcome: ...


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs to build its backend; plain data, so Ray ships it cheaply."""

    backend: str  # cuda | interpret | simulate
    kernel: str
    problem: Mapping[str, Any]
    warmup_ms: float
    rep_ms: float
    tolerance: tuple[float, float] | None
    seed: int
    simulate: Mapping[str, Any]


def make_backend(settings: WorkerSettings) -> Backend:
    if settings.backend == "simulate":
        from actors.simulate import SimulatedBackend

        return SimulatedBackend(**settings.simulate)
    interpret = settings.backend == "interpret"
    if interpret:
        # Triton decides interpreter or compiler when a kernel module is imported.
        os.environ["TRITON_INTERPRET"] = "1"
    from actors.triton_backend import TritonBackend
    from kernels import load_kernel

    return TritonBackend(load_kernel(settings.kernel), settings.problem, interpret=interpret,
                         warmup_ms=settings.warmup_ms, rep_ms=settings.rep_ms,
                         tolerance=settings.tolerance, seed=settings.seed)


class TrialWorker:
    def __init__(self, settings: WorkerSettings, name: str) -> None:
        self.backend = make_backend(settings)
        self.name = name
        self.node = socket.gethostname()

    def info(self) -> dict[str, Any]:
        return {"device": self.backend.device_name, "node": self.node, "worker": self.name,
                "pid": os.getpid()}

    def run(self, trials: list[tuple[int, dict[str, Any], int]]) -> Iterator[WorkerMessage]:
        from actors.triton_backend import ProcessPoisoned

        yield BatchStarted()
        for index, config, attempt in trials:
            started = time.time()
            retire = None
            try:
                outcome = self.backend.run_trial(config)
            except ProcessPoisoned as e:
                outcome, retire = e.outcome, Retire(e.outcome.error or "sticky CUDA error")
            yield TrialRecord.from_outcome(
                index, config, outcome, device=self.backend.device_name, node=self.node,
                worker=self.name, attempt=attempt, started_at=started, finished_at=time.time())
            if retire is not None:
                yield retire
                return
