"""The trial worker: a Ray actor that owns one GPU (or one CPU for the interpreter, or one
simulated GPU) and runs the trials the driver hands it, streaming a record per trial.

run() is a Ray generator, so the driver sees each trial finish as it happens: it knows
which trial is running (the one after the last record) and since when, which is what a
per-trial timeout and the blame for a dead worker need.

The actor is threaded so that a batch the driver queues behind the running one arrives at
once: its configs go to the compile pool while the GPU still times the running batch, and
the GPU never waits at a batch boundary. Batches still run one at a time, in the driver's
order (Ray does not order a threaded actor's tasks, so each batch carries its number).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from actors.compile_pool import Compiled
from actors.timing import Timing
from storage.records import TrialOutcome, TrialRecord


@dataclass(frozen=True)
class BatchStarted:
    """The worker began a batch; the first trial's clock starts now, not at submission."""


WorkerMessage = BatchStarted | TrialRecord


class Backend(Protocol):
    device_name: str

    def run_trial(self, config: Mapping[str, Any], seed: int,
                  compiled: Compiled | None = None) -> TrialOutcome: ...

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> list[Timing]: ...


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs to build its backend; plain data, so Ray ships it cheaply."""

    backend: str  # cuda | interpret | simulate
    kernel: str
    problem: Mapping[str, Any]
    trial_timing: tuple[float, float]  # (warmup_ms, rep_ms) of each config's timing
    finalist_timing: tuple[float, float]  # and of the finalists' re-timing
    tolerance: tuple[float, float] | None
    seed: int
    simulate: Mapping[str, Any]
    compile_workers: int = 0  # processes compiling ahead of the GPU (cuda backend only)
    compile_timeout_s: float = 60.0
    kernel_path: str = ""  # where a "module:attr" kernel may live besides installed packages


def make_backend(settings: WorkerSettings) -> Backend:
    if settings.backend == "simulate":
        from actors.simulate import SimulatedBackend

        return SimulatedBackend(**settings.simulate)
    from actors.launcher import Launcher

    return Launcher(settings.kernel, settings.problem, kernel_path=settings.kernel_path,
                    interpret=settings.backend == "interpret",
                    trial_timing=settings.trial_timing, finalist_timing=settings.finalist_timing,
                    tolerance=settings.tolerance, seed=settings.seed)


class TrialWorker:
    def __init__(self, settings: WorkerSettings, name: str) -> None:
        self.pool = None
        if settings.backend == "cuda" and settings.compile_workers > 0:
            from actors.compile_pool import CompilePool

            # Started first: its processes boot while this one sets up the GPU.
            self.pool = CompilePool(settings.compile_workers, settings.kernel,
                                    settings.problem, settings.seed,
                                    settings.compile_timeout_s, settings.kernel_path)
        self.backend = make_backend(settings)
        self.seed = settings.seed
        self.name = name
        self.node = socket.gethostname()
        self._turn = 0  # the number of the batch whose turn it is to run
        self._turns = threading.Condition()

    def info(self) -> dict[str, Any]:
        """Who and where; answers once the worker, its compile pool included, is ready."""
        if self.pool is not None:
            self.pool.wait_ready()
        return {"device": self.backend.device_name, "node": self.node, "worker": self.name,
                "pid": os.getpid()}

    def run(self, number: int, trials: list[tuple[int, dict[str, Any], int]],
            ahead: Sequence[tuple[int, dict[str, Any]]] = ()) -> Iterator[WorkerMessage]:
        """Run batch `number` (0, 1, ... in the order the driver sent them) once every
        earlier batch has finished; its configs start compiling at once, and `ahead`
        (configs some worker will get soon) when the pool has nothing else to do."""
        if self.pool is not None:
            for index, config, _ in trials:
                self.pool.submit(index, config)
            for index, config in ahead:
                self.pool.hint(index, config)
        with self._turns:
            self._turns.wait_for(lambda: self._turn == number)
        try:
            yield BatchStarted()
            for index, config, attempt in trials:
                started = time.time()
                compiled = self.pool.result(index) if self.pool is not None else None
                # Fresh inputs per config, the same for every attempt and every run.
                seed = hash((self.seed, index)) & 0x7FFFFFFF
                outcome = self.backend.run_trial(config, seed, compiled)
                yield TrialRecord.from_outcome(
                    index, config, outcome, device=self.backend.device_name, node=self.node,
                    worker=self.name, attempt=attempt, started_at=started,
                    finished_at=time.time())
        finally:
            with self._turns:
                self._turn = number + 1
                self._turns.notify_all()

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> list[Timing]:
        return self.backend.retime(configs, rounds)
