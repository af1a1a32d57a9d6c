"""The trial worker: owns one GPU (or one CPU for the interpreter, or one simulated GPU)
and runs the trials the driver hands it, streaming a record per trial. The same object runs
in a process of this machine (actors/worker_host.py, the local runtime's) or as a Ray actor
(sweep/engines/ray/runtime.py).

run() yields per batch, one call per batch (a Ray generator on Ray), so the driver sees each
trial finish as it happens. It is threaded: a batch the driver queues behind the running one
arrives at once, and its configs go to the compile pool while the GPU still times earlier
ones.

One thread of the worker, the runner, owns the device and runs every trial. With a compile
pool it runs whichever held config has finished compiling (the oldest batch first), so the
GPU never waits on a slow compile while a compiled config waits; it announces each trial
as it begins (TrialStarted), which is how the driver knows what is running, for timeouts
and for the blame of a death. Without a pool (simulate, interpret) trials run in the order
sent, which the driver assumes, and nothing is announced.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors import trace
from actors.backends import traits
from actors.child import error_line
from actors.compiles import Compiled, Compiler
from actors.protocol import (
    FORKS,
    Batch,
    BatchStarted,
    CompileLimit,
    Finished,
    Note,
    Retimed,
    Trial,
    TrialStarted,
    WorkerFailed,
    WorkerMessage,
    WorkerSettings,
    compile_weight,
)
from storage.lines import encode
from storage.records import TrialOutcome, TrialRecord, Where


class WorkerError(RuntimeError):
    """What a batch's stream raises when the worker's runner failed: its message is the
    runner's exception as one line."""


MAX_CHUNK = 4096  # messages a batch's stream sends at once
# Before its pool is up, a worker holding only heavy configs waits this long for it, then
# compiles one itself (a pool slow to start must not leave the device idle for ever).
HEAVY_WAIT_S = 30.0
LINGER_S = 0.02  # how long a fast stream of records waits to send more at once
FAST_S = 0.002  # a stream is fast while its lists go out at most this far apart


class Backend(Protocol):
    @property
    def device_name(self) -> str: ...

    def run_trial(self, config: Mapping[str, Any],
                  compiled: Compiled | None = None) -> TrialOutcome: ...

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> Retimed: ...


def make_backend(settings: WorkerSettings, kind: str = "") -> Backend:
    if settings.backend == "simulate":
        from actors.simulate import SimulatedBackend

        return SimulatedBackend(**settings.simulate, device=kind)
    if settings.backend == "replay":
        from actors.replay import ReplayBackend

        return ReplayBackend.load(settings.replay)
    from actors.launcher import LAUNCHER_ENV, Launcher

    # Ray gives a GPU actor its GPU's id in CUDA_VISIBLE_DEVICES, as the local runtime
    # does; it names an interpreter's worker's launcher in LAUNCHER_ENV.
    key = os.environ.get(LAUNCHER_ENV) or os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return Launcher(launcher_payload(settings), adopt=settings.prestarted.get(key))


def launcher_payload(settings: WorkerSettings) -> str:
    """The options of the process that launches kernels (actors/launcher.py)."""
    return json.dumps({
        "kernel": settings.kernel, "kernel_path": settings.kernel_path,
        "problem": dict(settings.problem), "interpret": traits(settings.backend).interpreted,
        "trial_timing": settings.trial_timing, "finalist_timing": settings.finalist_timing,
        "screen": settings.screen, "tolerance": settings.tolerance, "seed": settings.seed,
        "fixed": dict(settings.fixed), "problem_keys": list(settings.problem_keys)})


def make_compiler(settings: WorkerSettings) -> Compiler | None:
    limit = CompileLimit(settings.compile_timeout_s)
    if settings.backend == "replay":
        from actors.replay import ReplayCompiler

        return ReplayCompiler.load(settings.replay, settings.compile_workers, limit,
                                   settings.problem_keys)
    if settings.backend == "cuda" and settings.compile_workers > 0:
        from actors.compile_pool import CompileJob, CompilePool

        forks = settings.prestarted.get(FORKS)
        # An adopted server's processes see every GPU: each is told the worker's.
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
        return CompilePool(settings.compile_workers, CompileJob.of(settings), limit,
                           devices=[gpu] if forks and gpu else (),
                           adaptive=settings.compile_limit_auto, forks=forks)
    return None


class _Chunk:
    """Messages gathered for one send; consecutive records go as one Finished."""

    def __init__(self) -> None:
        self._done: list[WorkerMessage] = []
        self._records: list[TrialRecord] = []
        self._lines: list[bytes | None] = []
        self.size = 0

    def add(self, message: WorkerMessage) -> int:
        """Returns how many records it added."""
        self.size += 1
        if isinstance(message, Finished):
            self._records += message.records
            self._lines += message.lines
            return len(message.records)
        self._flush()
        self._done.append(message)
        return 0

    def _flush(self) -> None:
        if self._records:
            self._done.append(Finished(tuple(self._records), tuple(self._lines)))
            self._records, self._lines = [], []

    def messages(self) -> list[WorkerMessage]:
        self._flush()
        return self._done


@dataclass
class _Held:
    """A batch the worker holds: the trials not yet begun, and its outgoing messages."""

    number: int
    trials: list[Trial]
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    started: bool = False


class TrialWorker:
    def __init__(self, settings: WorkerSettings, name: str, kind: str = "",
                 parts: tuple[Backend, Compiler | None] | None = None) -> None:
        """kind: the device type it was placed for (Placement.kinds), which a simulated
        device takes as its name. parts: its backend and compile pool, where the caller
        has them (a test's fakes); else made from settings."""
        if parts is not None:
            self.backend, self.pool = parts
        else:
            # Started first: its processes boot while this one sets up the device.
            self.pool = make_compiler(settings)
            self.backend = make_backend(settings, kind)
        self.run_id = settings.run
        self.problem_keys = settings.problem_keys
        self.name = name
        self.node = socket.gethostname()
        self._held: list[_Held] = []  # in batch order
        self._changed = threading.Condition()
        self._device = threading.Lock()  # trials and re-timing take turns on the device
        self._began = 0
        # Every config's compile weight it was sent: which count as light, before the
        # pool is up (see _next).
        self._weights: list[float] = []
        self._light = (0, 0.0)  # (of how many weights, their median)
        threading.Thread(target=self._runner, name="trial-runner", daemon=True).start()

    def info(self) -> dict[str, Any]:
        """Who and where; answers once the worker can run a trial (its compile processes
        join as they come up)."""
        from storage.cache import library_versions

        return {"device": self.backend.device_name, "node": self.node, "worker": self.name,
                "pid": os.getpid(), "versions": library_versions()}

    def set_limit(self, limit: CompileLimit) -> None:
        if self.pool is not None:
            self.pool.set_limit(limit)

    def run(self, batch: Batch) -> Iterator[list[WorkerMessage]]:
        """Hold the batch: its configs start compiling at once, and `ahead` (configs some
        worker will get soon) when the pool has nothing else to do. Streams the batch's
        messages, in lists of those ready at once, until every trial is reported."""
        number, trials, ahead, limit = batch.number, batch.trials, batch.ahead, batch.limit
        held = _Held(number, list(trials))
        if self.pool is not None:
            if limit is not None:
                self.pool.set_limit(limit)
            for index, config, _ in trials:
                self.pool.submit(index, config)
            self._weights += [compile_weight(config, self.problem_keys)
                              for _, config, _ in trials]
            for index, config in ahead:
                self.pool.hint(index, config)
        with self._changed:
            self._held.append(held)
            self._held.sort(key=lambda h: h.number)
            self._changed.notify_all()
        reported = 0
        sent = -LINGER_S  # when the last message list went
        while reported < len(trials):
            # Whatever has piled up goes as one message list: at thousands of trials a
            # second the cost is per list, at both ends. So while records come that fast
            # (the last list went under FAST_S ago) more are awaited for up to LINGER_S.
            # A record after a pause, or a start (which the driver's timeouts and blame go
            # by), waits for nothing.
            chunk = _Chunk()
            message = held.out.get()
            now = time.monotonic()
            until = now + LINGER_S if now - sent < FAST_S else now
            while True:
                if isinstance(message, WorkerFailed):
                    if chunk.size:
                        yield chunk.messages()
                    raise WorkerError(message.text)
                reported += chunk.add(message)
                if reported >= len(trials) or chunk.size >= MAX_CHUNK:
                    break
                if not isinstance(message, Finished):
                    until = 0.0
                try:
                    message = held.out.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
            sent = time.monotonic()
            yield chunk.messages()

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> Retimed:
        with self._device:
            return self.backend.retime(configs, rounds)

    # --- the runner thread -----------------------------------------------------------------
    def _runner(self) -> None:
        while True:
            running: _Held | None = None
            try:
                running, (index, config, attempt), compiled = self._next()
                self._run_one(running, index, config, attempt, compiled)
            except BaseException as e:  # fail every batch it holds rather than hang them,
                # the one it was running among them (already out of _held if that was its
                # last trial)
                with self._changed:
                    failing = list(self._held)
                    if running is not None and running not in failing:
                        failing.append(running)
                    for held in failing:
                        held.out.put(WorkerFailed(error_line(e)))
                    self._held.clear()

    def _next(self) -> tuple[_Held, tuple[int, dict[str, Any], int], Compiled | None]:
        """The trial to run next: in order without a pool; with one, the first held config
        (oldest batch first) whose compile has finished (None: not compiled ahead)."""
        idle_since: float | None = None  # since when nothing it holds could run
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._held))
                held_now = list(self._held)
            if self.pool is None:
                held = held_now[0]
                return held, self._take(held, 0), None
            keys = [t.index for h in held_now for t in h.trials]
            got: tuple[int, Compiled | None] | None = self.pool.take(keys)
            up = self.pool.started()
            for text in self.pool.notices():
                held_now[0].out.put(Note(text))
            if got is None and not up:
                # No compile process is up yet (they import torch first): the device's
                # own process compiles a config itself rather than wait for them, the
                # likely-quickest (perhaps compiled before Ray was up, see prestart.py).
                # Only a light one: a heavy tile's compile can outlast the trial's
                # timeout there (minutes, for 1-2 warps on 32x8192), where no compile
                # limit stops it. Once the pool is down, every config is compiled here.
                configs = {t.index: t.config for h in held_now for t in h.trials}
                weight = {k: compile_weight(configs[k], self.problem_keys) for k in keys}
                waited = time.monotonic() - (idle_since or time.monotonic())
                any_weight = self.pool.down() or waited >= HEAVY_WAIT_S
                quickest = sorted(keys, key=weight.__getitem__)
                light = self._light_weight()
                key = next((k for k in quickest if (weight[k] <= light or any_weight)
                            and self.pool.withdraw(k)), None)
                if key is not None:
                    got = key, None
            if got is None:
                idle_since = idle_since or time.monotonic()
                self.pool.wait(0.05)
                continue
            key, compiled = got
            for held in held_now:
                for i, trial in enumerate(held.trials):
                    if trial.index == key:
                        return held, self._take(held, i), compiled

    def _light_weight(self) -> float:
        """The median compile weight of the configs it was sent (kept until more come)."""
        if self._light[0] != len(self._weights):
            self._light = (len(self._weights), statistics.median_low(self._weights))
        return self._light[1]

    def _take(self, held: _Held, position: int) -> Trial:
        with self._changed:
            trial = held.trials.pop(position)
            if not held.trials:
                self._held.remove(held)
        return trial

    def _run_one(self, held: _Held, index: int, config: dict[str, Any], attempt: int,
                 compiled: Compiled | None) -> None:
        # Waits for the device's process: a failure to start it is the worker's, raised
        # before any trial is said to have begun.
        device = self.backend.device_name
        if not held.started:
            held.started = True
            held.out.put(BatchStarted())
        if self.pool is not None:
            held.out.put(TrialStarted(index, self._began, compiled is not None))
        self._began += 1
        started = time.time()
        trace.note("trial", key=index, ahead=compiled is not None)
        with self._device:
            outcome = self.backend.run_trial(config, compiled)
        if outcome.missed and self.pool is not None:
            self.pool.missed()
        if self.problem_keys:  # the row's columns hold the problem; its config, the kernel's
            config = {k: v for k, v in config.items() if k not in self.problem_keys}
        record = TrialRecord.from_outcome(
            index, config, outcome, where=Where(device, self.node, self.name), attempt=attempt,
            started_at=started, finished_at=time.time())
        held.out.put(Finished((record,), (encode(record, self.run_id) if self.run_id else None,)))
