"""One invocation of `sweep run` or `sweep resume`: validate, join Ray, drive, finalize.

Everything that can be refused (spec, run directory, fingerprint) is checked before Ray
starts; a signal at any point from start-up to the final write ends in a clean stop.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ray.exceptions import RayError
from rich.console import Console

from actors.worker import WorkerSettings
from storage import cache
from storage.journal import Journal, read_attempts
from storage.snapshot import Best, SnapshotError, read_snapshot, write_snapshot
from sweep import EXIT_FAILED, EXIT_OK, cluster, rundir
from sweep.driver import Driver, DriverFailed, Limits, Placement
from sweep.progress import ProgressReporter
from sweep.report import print_summary, resume_command, say
from sweep.rundir import RunDir
from sweep.space import Space
from sweep.spec import Spec, SpecError, check_dtype_for_backend, load_spec
from sweep.stop import StopController
from sweep.tally import Tally

# Batches big enough that Ray's per-call cost stays small next to the work they carry.
TARGET_BATCH_S = 0.05


@dataclass
class Session:
    spec: Spec
    space: Space
    path: Path
    meta: dict[str, Any] | None  # the run's run.json when resuming
    snapshot_says_complete: bool = False

    @classmethod
    def start(cls, spec_path: Path, out: Path | None, backend: str | None) -> Session:
        spec = load_spec(spec_path, backend=backend)
        space = spec.expand()
        path = out or rundir.default_out(spec)
        if RunDir(path).holds_run():
            raise SpecError(f"{path}: already holds a run; continue it with: "
                            f"{resume_command(path)}")
        return cls(spec, space, path, None)

    @classmethod
    def reopen(cls, path: Path, err: Console) -> Session:
        run = RunDir(path)
        meta = rundir.read_meta(run)
        spec = load_spec(run.spec)
        if spec.fingerprint != meta["fingerprint"]:
            raise SpecError(f"{path}: the spec, kernel source or problem changed since this run "
                            f"started (fingerprint {meta['fingerprint']}, now "
                            f"{spec.fingerprint}); start a new run with sweep run")
        space = spec.expand()
        if len(space) != meta["total"]:
            raise SpecError(f"{path}: the space now expands to {len(space)} configs, "
                            f"the run has {meta['total']}")
        complete = False
        if run.snapshot.exists():
            try:
                complete = read_snapshot(run.snapshot).state == "complete"
            except SnapshotError as e:
                say(err, f"warning: {e}; rebuilding the run from the journal")
        return cls(spec, space, path, meta, complete)

    def execute(self, address: str | None, max_trials: int | None, cache_partial: bool,
                stop: StopController, out: Console, err: Console) -> int:
        t0 = time.monotonic()
        run = RunDir(self.path)
        tally = Tally(total=len(self.space))
        records = None
        if self.meta and self.snapshot_says_complete:
            records = rundir.load_records(run, self.spec)[0]
            tally = Tally.from_journal(len(self.space), records)
            if tally.done == tally.total:
                rundir.finalize(run, self.spec, self.space, tally, "complete")
                say(out, f"{self.path}: already complete ({tally.total} trials); "
                         "artefacts rewritten from the journal")
                return EXIT_OK
        # Reading a big journal and starting Ray both take seconds: do them side by side
        # (Ray must start on this, the main thread: its processes die with the thread).
        started_ray = False
        try:
            with ThreadPoolExecutor(1) as pool:
                loading = pool.submit(rundir.load_records, run, self.spec) if self.meta \
                    else None
                started_ray = self._connect(address, stop)
                if loading is not None:
                    records = loading.result()[0]
                    tally = Tally.from_journal(len(self.space), records)
            backend = cluster.resolve_backend(self.spec)
            check_dtype_for_backend(self.spec.path, self.spec.problem, backend)
            if self.meta and backend != self.meta["backend"]:
                raise SpecError(f"{self.path}: the run used backend {self.meta['backend']}, "
                                f"but this cluster resolves to {backend}; pass the same kind "
                                "of cluster")
            if stop.requested and not self.meta:
                say(err, "stopped before the run started; nothing was written")
                return stop.exit_code
            if not self.meta:
                run = rundir.create(self.path, self.spec, len(self.space), backend)
            code = self._drive(run, backend, tally, records, max_trials, stop, out, err, t0)
            state = "complete" if tally.done == tally.total else "interrupted"
            if tally.best and (state == "complete" or cache_partial):
                self._cache_best(tally, backend, partial=state != "complete")
            return code
        finally:
            if started_ray:
                import ray

                ray.shutdown()

    def _cache_best(self, tally: Tally, backend: str, partial: bool) -> None:
        best = tally.best
        assert best is not None
        spec = self.spec
        cache.store(cache.CacheEntry(
            kernel=spec.kernel, kernel_source=spec.kernel_source, problem=dict(spec.problem),
            backend=backend, device=best.device, config=best.config,
            latency_ms=best.latency_ms, fingerprint=spec.fingerprint,
            run_dir=str(self.path.resolve()), partial=partial, written_at=time.time()))

    def _connect(self, address: str | None, stop: StopController) -> bool:
        try:
            started = cluster.connect(address)
        except SystemExit as e:  # Ray's own SIGTERM handler fires during its start-up
            if e.code != signal.SIGTERM:
                raise
            stop.request(signal.SIGTERM)
            started = cluster.connect(address)
        except ConnectionError as e:
            where = address or "RAY_ADDRESS"
            raise SpecError(f"--address: cannot reach a Ray cluster at {where} ({e})") from None
        stop.install()  # ray.init replaced our SIGTERM handler
        return started

    def _drive(self, run: RunDir, backend: str, tally: Tally, records: Any,
               max_trials: int | None, stop: StopController, out: Console, err: Console,
               t0: float) -> int:
        spec = self.spec
        done = records.column("index").to_numpy() if records is not None else np.empty(0, int)
        todo = np.setdiff1d(np.arange(len(self.space)), done, assume_unique=True)
        spent, deaths = read_attempts(run.attempts)
        placement = cluster.placement(spec, backend)
        settings = WorkerSettings(
            backend=backend, kernel=spec.kernel, problem=dict(spec.problem),
            trial_timing=spec.timing.per_config(spec.run.finalists),
            finalist_timing=(spec.timing.warmup_ms, spec.timing.rep_ms),
            tolerance=(spec.validation.rtol, spec.validation.atol) if spec.validation else None,
            seed=spec.run.seed,
            simulate={k: v for k, v in vars(spec.simulate).items() if k != "workers"},
            compile_workers=placement.compile_workers,
            compile_timeout_s=spec.run.trial_timeout_s)
        limits = Limits(
            trial_timeout_s=spec.run.trial_timeout_s, max_retries=spec.run.max_retries,
            drain_s=spec.run.drain_s, snapshot_every_s=spec.run.snapshot_every_s,
            batch_size=_batch_size(spec, backend, placement), max_trials=max_trials,
            start_timeout_s=spec.run.start_timeout_s)

        checkpoint = rundir.TableCheckpoint(run, spec, self.space)

        def snapshot() -> None:
            write_snapshot(run.snapshot, rundir.snapshot_of(spec, tally, "running"))
            checkpoint.maybe_start()

        write_snapshot(run.snapshot, rundir.snapshot_of(spec, tally, "running"))
        state = "failed"
        finalists: list[dict[str, Any]] = []
        driver = None
        try:
            with Journal(run.journal) as journal, Journal(run.attempts) as attempt_log, \
                    ProgressReporter(tally, err) as progress:
                driver = Driver(self.space, settings, placement, limits, journal, attempt_log,
                                tally, todo.tolist(), spent, deaths,
                                should_stop=lambda: stop.requested, on_snapshot=snapshot,
                                observers=[progress])
                try:
                    if driver.run() == "complete" and not stop.requested:
                        finalists = self._retime_finalists(driver, tally, progress)
                finally:
                    driver.close()
            state = "complete" if tally.done == tally.total else "interrupted"
        except DriverFailed as e:
            say(err, f"error: {e}")
        finally:
            checkpoint.wait()
            rundir.finalize(run, spec, self.space, tally, state,  # type: ignore[arg-type]
                            finalists, driver.first_dispatch_at if driver else None)
        print_summary(out, spec.name, self.path, state, tally, time.monotonic() - t0)
        if state == "failed":
            return EXIT_FAILED
        # A signal that lands during the final write of a finished run changes nothing.
        return stop.exit_code if stop.requested and state != "complete" else EXIT_OK

    def _retime_finalists(self, driver: Driver, tally: Tally,
                          progress: ProgressReporter) -> list[dict[str, Any]]:
        """One pass picks winners by noise as much as by speed: re-time the fastest few
        side by side and let that decide the best. Updates tally.best."""
        leaders = tally.leaders(self.spec.run.finalists)
        if len(leaders) < 2:
            return []
        progress.on_event(f"re-timing the {len(leaders)} fastest configs side by side")
        try:
            timings = driver.retime([b.config for b in leaders],
                                    self.spec.run.finalist_rounds)
        except RayError as e:  # the sweep's own best stands; nothing is lost
            progress.on_event(f"re-timing failed, keeping the sweep's best: {str(e)[:200]}")
            return []
        finalists = [{"index": b.index, "config": b.config, "sweep_latency_ms": b.latency_ms,
                      "latency_ms": t.median_ms, "latency_p20_ms": t.p20_ms,
                      "latency_p80_ms": t.p80_ms} for b, t in zip(leaders, timings)]
        chosen = min(finalists, key=lambda f: (f["latency_ms"], f["index"]))
        tally.best = Best(chosen["index"], chosen["config"], chosen["latency_ms"],
                          leaders[0].device)
        return finalists


def _batch_size(spec: Spec, backend: str, placement: Placement) -> int:
    if backend == "cuda":
        # Enough configs per batch that the compile pool works ahead of the GPU.
        return 2 * max(1, placement.compile_workers)
    if backend != "simulate":
        return 1  # interpreted trials take far longer than a Ray round trip
    per_trial_s = max(spec.simulate.trial_ms, 0.05) / 1e3
    return int(min(64, max(1, TARGET_BATCH_S / per_trial_s)))
