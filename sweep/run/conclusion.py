"""How a driven run ends for its user: the best-config cache's entry, the lines said about
how it ended, the summary, and the exit code (docs/cli.md, Exit codes)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from storage.table import read_parquet
from sweep import EXIT_FAILED, EXIT_NONE_WORKED, EXIT_OK
from sweep.console import Output
from sweep.engines.runtime import ClusterLost
from sweep.results.summary import (
    Summary,
    print_errors,
    print_summary,
    problem_labels,
    resume_command,
)
from sweep.run import cache_policy
from sweep.run.assembly import Assembly
from sweep.run.budget import TimeBudget
from sweep.run.driver import Driver
from sweep.run.request import Request
from sweep.run.rundir import Finish, RunDir
from sweep.run.stop import StopController
from sweep.search.strategies import most
from sweep.spec import Spec
from sweep.spec.space import Space


@dataclass
class Driven:
    """What driving a run left: how it ended (complete, interrupted or failed), its
    assembly, the finish, the driver (None where none was made), the cluster's loss where
    that ended it, and its time budget."""

    state: str
    assembly: Assembly
    finish: Finish
    driver: Driver | None
    lost: ClusterLost | None
    budget: TimeBudget


@dataclass(frozen=True)
class Concluding:
    """The session's side of the ending: its spec and space, its run, the backend it ran
    on, the statuses it retried, where it speaks, what was asked, the stop, its start."""

    spec: Spec
    space: Space
    path: Path
    run: RunDir
    backend: str
    retry: frozenset[str]
    io: Output
    request: Request
    stop: StopController
    t0: float


def conclude(c: Concluding, drove: Driven) -> int:
    """The cache's entry, the summary and the exit code of a run that was driven."""
    spec, state, tally, driver = c.spec, drove.state, drove.assembly.work.tally, drove.driver
    request, stop, io = c.request, c.stop, c.io
    unsettled = drove.finish.unsettled
    # A retry stopped partway goes on only if asked again: say so in the hint.
    again = f" --retry {','.join(sorted(c.retry))}" if c.retry else ""
    spent_budget = state == "interrupted" and not stop.requested and drove.budget.spent()
    # Cached before the summary is printed: a closed stdout (`| head -1`) must not lose it.
    partial = state != "complete" or unsettled
    if tally.best and state != "failed" and drove.lost is None and \
            (not partial or request.cache_partial):
        cache_policy.store_best(spec, c.path, tally, c.backend, partial, io.err,
                                driver.pool.versions if driver else {})
    if spent_budget:
        io.note(f"the time budget of {request.time_budget_s:g} s is spent; the run "
                "stops resumably")
    if state == "complete" and unsettled:
        io.note(f"{'stopped' if stop.requested else 'cut short (see above)'} before "
                "the fastest configs were re-timed side by side: the best is one "
                "pass's, so the best-config cache does not take it (--force tunes "
                "again)")
    print_summary(io.out, Summary(
        spec.name, c.path, state, tally, time.monotonic() - c.t0, again,
        most(spec.search, c.space.sizes) if "pruned" not in c.retry else None,
        problem_labels(spec), drove.assembly.done_before))
    if request.max_trials is not None and state == "interrupted" and \
            driver is not None and driver.dispatched >= request.max_trials:
        # Each session counts its own: a resume with --max-trials 100 runs 100 more.
        io.result(f"  --max-trials {request.max_trials}: this session ran "
                  f"{tally.done - drove.assembly.done_before} of them; each session "
                  "counts its own")
    if state == "complete" and tally.best is None:
        table = read_parquet(c.run.trials, columns=["index", "status", "error"])
        print_errors(io.out, table)
        return EXIT_NONE_WORKED
    if drove.lost is not None:
        io.note(f"error: {drove.lost}; every finished trial is written. Resume "
                f"with: {resume_command(c.path)}")
        return EXIT_FAILED
    if state == "failed":
        return EXIT_FAILED
    # A signal that lands during the final write of a finished run changes nothing;
    # one that cut its rungs or finalists short stopped the run's pick.
    return stop.exit_code if stop.requested and (state != "complete" or unsettled) \
        else EXIT_OK
