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

from actors.compile_pool import Compiled
from actors.timing import Timing
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

    def run_trial(self, config: Mapping[str, Any], seed: int,
                  compiled: Compiled | None = None) -> TrialOutcome: ...

    def retime(self, configs: list[Mapping[str, Any]], rounds: int) -> list[Timing]: ...


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
    compile_workers: int = 0  # processes compiling ahead of the GPU (cuda backend only)
    compile_timeout_s: float = 60.0


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
        self.pool = None
        if settings.backend == "cuda" and settings.compile_workers > 0:
            from actors.compile_pool import CompilePool

            # Started first: its processes boot while this one sets up the GPU.
            self.pool = CompilePool(settings.compile_workers, settings.kernel,
                                    settings.problem, settings.seed,
                                    settings.compile_timeout_s)
        self.backend = make_backend(settings)
        self.seed = settings.seed
        self.name = name
        self.node = socket.gethostname()

    def info(self) -> dict[str, Any]:
        """Who and where; answers once the worker, its compile pool included, is ready."""
        if self.pool is not None:
            self.pool.wait_ready()
        return {"device": self.backend.device_name, "node": self.node, "worker": self.name,
                "pid": os.getpid()}

    def run(self, trials: list[tuple[int, dict[str, Any], int]]) -> Iterator[WorkerMessage]:
        from actors.triton_backend import ProcessPoisoned

        if self.pool is not None:
            for index, config, _ in trials:
                self.pool.submit(index, config)
        yield BatchStarted()
        for index, config, attempt in trials:
            started = time.time()
            retire = None
            try:
                compiled = self.pool.result(index) if self.pool is not None else None
                # Fresh inputs per config, the same for every attempt and every run.
                seed = hash((self.seed, index)) & 0x7FFFFFFF
                outcome = self.backend.run_trial(config, seed, compiled)
            except ProcessPoisoned as e:
                outcome, retire = e.outcome, Retire(e.outcome.error or "sticky CUDA error")
            yield TrialRecord.from_outcome(
                index, config, outcome, device=self.backend.device_name, node=self.node,
                worker=self.name, attempt=attempt, started_at=started, finished_at=time.time())
            if retire is not None:
                yield retire
                return

    def retime(self, configs: list[dict[str, Any]], rounds: int) -> list[Timing]:
        return self.backend.retime(configs, rounds)
