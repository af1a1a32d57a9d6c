"""A session's drive step: the run assembled, its workers driven through the trials, the
finish (halving, the finalists' re-timing), and the run's files written however it ended
(sweep/run/session.py calls it once the engine is up and the run directory is made)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass

from storage.snapshot import write_snapshot
from sweep.console import Output
from sweep.engines.runtime import ClusterLost, Engine, Placement
from sweep.run import rundir
from sweep.run.assembly import Assembly, Start, assemble
from sweep.run.budget import TimeBudget
from sweep.run.conclusion import Driven
from sweep.run.contracts import DriverFailed
from sweep.run.driver import Driver
from sweep.run.finish import Finishing, after_trials
from sweep.run.progress import ProgressReporter
from sweep.run.request import Request
from sweep.run.rundir import Finish, RunDir, RunLog
from sweep.run.stop import StopController
from sweep.search.scheduling import AdaptiveLimit
from sweep.search.strategies import most
from sweep.spec import Spec
from sweep.spec.space import Space


@dataclass(frozen=True)
class RunContext:
    """What the drive works over: the session's run, spec and engine, where its workers
    go, the command's output, and the session's moments (its timeline, which the drive and
    the finish add to, and the spans of the sessions before it)."""

    run: RunDir
    spec: Spec
    space: Space
    engine: Engine
    backend: str
    placement: Placement
    io: Output
    timeline: dict[str, float]
    earlier: list[list[float]]
    launchers: dict[str, tuple[str, str, int]]  # begun before the engine was up, by GPU
    # The workers' compile pools are up: the early compiles end, teaching the limit.
    on_compilers_up: Callable[[AdaptiveLimit | None], None]

    def moments(self, driver: Driver | None) -> rundir.Moments:
        return rundir.Moments(self.timeline, self.earlier,
                              driver.first_dispatch_at if driver else None)


def drive(context: RunContext, start: Start, request: Request, stop: StopController,
          t0: float) -> Driven:
    """Drive the run to its end (complete, stopped, failed or its cluster lost); its
    snapshot, table and best.json are written whichever it was."""
    run, spec, space = context.run, context.spec, context.space
    assembly = assemble(run, spec, space, start, context.backend, context.placement,
                        context.launchers, context.io.err)
    tally = assembly.work.tally
    checkpoint = rundir.TableCheckpoint(run, spec, space)

    def snapshot() -> None:
        write_snapshot(run.snapshot, rundir.snapshot_of(spec, tally, "running",
                                                        context.moments(None)))
        checkpoint.maybe_start()

    budget = TimeBudget(t0, request.time_budget_s)

    def should_stop() -> bool:
        return stop.requested or budget.spent()

    drove = Driven("failed", assembly, Finish(), None, None, budget)
    in_flight = True  # an exception is on its way out of the try below
    try:
        write_snapshot(run.snapshot, rundir.snapshot_of(spec, tally, "running",
                                                        context.moments(None)))
        with RunLog.open(run, spec.fingerprint) as log, \
                ProgressReporter(tally, context.io.err,
                                 expected=most(spec.search, space.sizes)
                                 if assembly.search is not None else None) as progress:
            drove.driver = _driver(context, assembly, log, progress, request, should_stop,
                                   snapshot)
            try:
                ending = drove.driver.run()
                drove.finish = after_trials(
                    Finishing(run, spec, space, context.backend, drove.driver.pool, progress,
                              should_stop),
                    drove.driver, ending, assembly, log, context.timeline)
            finally:
                drove.driver.close()
        drove.state = "complete" if tally.done == tally.total else "interrupted"
        in_flight = False
    except DriverFailed as e:
        context.io.note(f"error: {e}")
        in_flight = False
    except ClusterLost as e:  # driver.run() has closed its workers, committed records
        context.engine.mark_lost()
        drove.state, drove.lost, in_flight = "interrupted", e, False
    except KeyboardInterrupt:  # an API caller's second Ctrl+C: written as a stop, then on
        drove.state = "interrupted"
        raise
    finally:
        if assembly.replay_cache:
            shutil.rmtree(assembly.replay_cache, ignore_errors=True)
        checkpoint.wait()
        _write_artefacts(context, drove, in_flight)
    return drove


def _driver(context: RunContext, assembly: Assembly, log: RunLog, progress: ProgressReporter,
            request: Request, should_stop: Callable[[], bool],
            snapshot: Callable[[], None]) -> Driver:
    runtime = context.engine.runtime(assembly.settings, context.placement,
                                     assembly.work.limits.max_batches)
    limit = assembly.work.compile_limit
    return progress.watching(Driver(
        assembly.work, runtime, log, should_stop=should_stop, on_snapshot=snapshot,
        observers=[progress, *request.observers],
        on_compilers_up=lambda: context.on_compilers_up(limit)), limit)


def _write_artefacts(context: RunContext, drove: Driven, in_flight: bool) -> None:
    try:
        rundir.write_artefacts(context.run, context.spec, context.space,
                               drove.assembly.work.tally,
                               drove.state,  # type: ignore[arg-type]
                               context.moments(drove.driver), drove.finish)
    except OSError as e:
        if not rundir.storage_error(e, context.run.path) or not in_flight:
            raise  # alone, a full disk is one line and exit 1 (see Session.execute)
        # Already failing for the same reason: the artefacts on disk stay the last
        # complete ones, and resume rebuilds them from the journal.
