"""The finish of a run once its trials are done: a search's pruned rows, successive
halving's rungs, and the finalists re-timed side by side, which decide the best.

One pass picks winners by noise as much as by speed, so the fastest few are timed again
together on each device type before a best is final; a stop that cuts this short leaves
the run `unsettled`, whose best the cache does not take. Not on Triton's interpreter:
its timings say how fast Python interprets a kernel, not how fast a GPU runs it, so
re-timing (half a quickstart's wall time there) would settle a pick that means nothing;
the one pass's fastest is the best, its finalists listed with `retimed: false`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from actors.backends import traits
from actors.protocol import Timing
from storage.best_file import raced_through
from storage.records import PRUNED, Best, TrialRecord, canonical_json
from sweep.engines.runtime import RetimeAbandoned
from sweep.results.summary import problem_labels
from sweep.results.tally import LEADERS, Tally
from sweep.run import rundir
from sweep.run.assembly import Assembly, interpreted_options
from sweep.run.contracts import DriverFailed
from sweep.run.driver import Driver
from sweep.run.progress import ProgressReporter
from sweep.run.retiming import retime, retime_spread
from sweep.run.rundir import Finish, RunDir, RunLog
from sweep.run.workers import WorkerPool
from sweep.search.strategies import Search, rungs
from sweep.spec import Spec
from sweep.spec.space import Space

PRUNE_CHUNK = 10_000  # pruned rows journaled at once


@dataclass(frozen=True)
class Finishing:
    """What every step of the finish works with: the run, its spec and space, the backend,
    the workers the trials ran on, where it says what it does, and whether to stop."""

    run: RunDir
    spec: Spec
    space: Space
    backend: str
    workers: WorkerPool
    progress: ProgressReporter
    should_stop: Callable[[], bool]


def after_trials(f: Finishing, driver: Driver, ending: str, assembly: Assembly, log: RunLog,
                 timeline: dict[str, float]) -> Finish:
    """The finish of a run whose driver ended `ending`; timeline gains its moments."""
    spec, tally, search = f.spec, assembly.work.tally, assembly.search
    if search is not None and ending == "complete" and search.settled() and \
            not f.should_stop():
        prune(f, search, assembly.pruned_before, assembly.work.spent, log, tally)
    timeline.update(driver.timeline, trials_done=time.time())
    if ending != "complete":
        return Finish()
    if f.should_stop():  # stopped as the last trial or a rung ended
        return _cut_short(spec, tally, f.backend)
    promoted = halve(f) if spec.search.strategy == "halving" else None
    if f.should_stop():
        return _cut_short(spec, tally, f.backend)
    if tally.problems:
        done = _retime_each_problem(f, tally, promoted)
    else:
        done = retime_finalists(f, tally, promoted[0] if promoted else None)
    timeline["finalists_done"] = time.time()
    return done


def _retime_each_problem(f: Finishing, tally: Tally,
                         promoted: list[dict[str, list[Best]]] | None = None) -> Finish:
    """retime_finalists for each problem in turn, each on its own trials, with configs as
    the workers take them (the problem's keys in each)."""
    each = []
    labels = problem_labels(f.spec)
    for p, mine in enumerate(tally.problems):
        if f.should_stop():
            each.append(_cut_short(f.spec, mine, f.backend))
            continue
        done = retime_finalists(f, mine, promoted[p] if promoted else None,
                                full=f.space.config, label=f" for {labels[p]}")
        for finalist in done.finalists:
            finalist["problem"] = p
        each.append(done)
    first = each[0]
    return Finish(first.finalists, first.baseline, any(d.unsettled for d in each), each)


def _cut_short(spec: Spec, tally: Tally, backend: str) -> Finish:
    """A stop before the finalists were re-timed: unsettled wherever there were two or
    more to re-time (in any problem); never on the interpreter, which re-times none."""
    return Finish(unsettled=not traits(backend).interpreted and any(
        len(t.leaders(spec.run.finalists, d)) >= 2
        for t in (tally.problems or [tally]) for d in t.devices))


def prune(f: Finishing, search: Search, before: pa.Table | None, spent: dict[int, int],
          log: RunLog, tally: Tally) -> None:
    """The search is over: every config it did not run gets its `pruned` row, durably, as
    a trial's record would; one pruned before keeps its row (and counts again)."""
    spec, space, progress = f.spec, f.space, f.progress
    pruned = search.pruned(len(space))
    kept: set[int] = set()
    if before is not None:  # those it prunes again; one it ran since is superseded
        still = before.filter(pc.is_in(before.column("index"), pa.array(pruned, pa.int64())))
        kept = set(still.column("index").to_pylist())
        tally.add(rundir.rows_as_records(still))
    now = time.time()
    todo = [i for i in pruned if i not in kept]
    for start in range(0, len(todo), PRUNE_CHUNK):  # a big space's, a chunk at a time
        records = [TrialRecord(
            index=i, config=space.kernel_config(i), status=PRUNED, latency_ms=None,
            latency_p20_ms=None, latency_p80_ms=None, validation="skipped", error=None,
            compile_ms=None, device="", node="", worker="",
            attempt=spent.get(i, 0) + 1, started_at=now, finished_at=now)
            for i in todo[start:start + PRUNE_CHUNK]]
        log.commit(records, [], [None] * len(records))
        tally.add(records)
    if todo or kept:
        progress.on_event(f"the {spec.search.strategy} search is over after "
                          f"{len(search.known)} configs; {len(todo) + len(kept)} pruned")


def halve(f: Finishing) -> list[dict[str, list[Best]]] | None:
    """Successive halving's rungs after its screened sample: on each device type (of each
    problem, in a sweep over problems), 1/eta of the configs that worked are re-timed
    carefully across every worker at once, then 1/eta of those, down to the finalists,
    which are returned, fastest first, by problem (None: a rung failed or was stopped,
    the one pass's leaders stand)."""
    spec, space = f.spec, f.space
    records = rundir.load_records(f.run, spec, space).records
    ok = records.filter(pc.equal(records.column("status"), "ok"))
    out: list[dict[str, list[Best]]] = []
    labels = problem_labels(spec)
    for p in range(len(space.starts)):
        at = space.problem_range(p)
        index = ok.column("index")
        mine = ok.filter(pc.and_(pc.greater_equal(index, at.start), pc.less(index, at.stop)))
        of = f" for {labels[p]}" if spec.problems else ""
        promoted: dict[str, list[Best]] = {}
        for device in sorted(set(mine.column("device").to_pylist())):
            rows = mine.filter(pc.equal(mine.column("device"), device)).to_pylist()
            rung = _rungs(f, device + of, [
                Best(r["index"], json.loads(r["config"]), r["latency_ms"], device)
                for r in sorted(rows, key=lambda r: (r["latency_ms"], r["index"]))])
            if rung is None:
                return None
            promoted[device] = rung
        out.append(promoted)
    return out


def _rungs(f: Finishing, where: str, rung: list[Best]) -> list[Best] | None:
    """One device type's (and problem's) rungs: its finalists, fastest first."""
    spec, progress, should_stop = f.spec, f.progress, f.should_stop
    keep = max(1, spec.run.finalists)
    device = rung[0].device
    for level, size in enumerate(rungs(len(rung), spec.search.eta, keep), 1):
        if should_stop():  # a fast backend's rungs end between two checks of it
            return None
        rung = rung[:size]
        progress.on_event(f"rung {level}: re-timing the {len(rung)} fastest on "
                          f"{where} carefully, on every worker at once")
        try:
            timings = retime_spread(f.workers, [f.space.config(b.index) for b in rung],
                                    device, should_stop)
        except (DriverFailed, RetimeAbandoned) as e:
            progress.on_event(f"rung {level} failed, keeping the one pass's order: "
                              f"{str(e)[:200]}")
            return None
        order = sorted(range(len(rung)), key=lambda k: (timings[k].median_ms,
                                                        rung[k].index))
        rung = [rung[k] for k in order]
    return rung[:keep]


def retime_finalists(f: Finishing, tally: Tally, promoted: dict[str, list[Best]] | None = None,
                     full: Callable[[int], dict[str, Any]] | None = None,
                     label: str = "") -> Finish:
    """Re-time the fastest few side by side and let that decide the best: on each device
    type the records name, on a device of that type. Updates tally's bests. promoted:
    each device type's finalists, where halving's rungs chose them. On the interpreter
    none is re-timed (see the module's docstring): the finalists are listed, configs that
    differ only in launch options as one program (its fastest one-pass config). full: a
    trial's config as workers take it, by index (a problem's keys in it), where that is
    more than its record's; label: the problem."""
    spec, backend, progress = f.spec, f.backend, f.progress
    done = Finish()
    noise = interpreted_options(spec, backend)
    winners: dict[str, Best] = {}
    for device in tally.devices:
        leaders = promoted[device] if promoted and device in promoted else \
            tally.leaders(LEADERS if noise else spec.run.finalists, device)
        if noise:
            leaders = _distinct_programs(leaders, noise)[:spec.run.finalists]
        if len(leaders) < 2:
            continue
        if traits(backend).interpreted:
            done.finalists += [_one_pass(b, device) for b in leaders]
            winners[device] = leaders[0]  # the one pass's fastest (or halving's pick)
            continue
        on = label + (f" on {device}" if len(tally.devices) > 1 else "")
        progress.on_event(f"re-timing the {len(leaders)} fastest configs{on} side by side")
        try:
            retimed = retime(f.workers, [full(b.index) if full else b.config for b in leaders],
                             spec.run.finalist_rounds, f.should_stop, device)
        except (DriverFailed, RetimeAbandoned) as e:  # the sweep's best stands
            progress.on_event(f"re-timing failed, keeping the sweep's best{on}: "
                              f"{str(e)[:200]}")
            # Cut short by a stop or by a lost worker alike, the best is one pass's.
            done.unsettled = True
            continue
        rounds = retimed.rounds or [spec.run.finalist_rounds] * len(leaders)
        done.finalists += [
            {"index": b.index, "config": b.config, "device": device,
             "sweep_latency_ms": b.latency_ms, "latency_ms": t.median_ms,
             "latency_p20_ms": t.p20_ms, "latency_p80_ms": t.p80_ms, "rounds": n}
            for b, t, n in zip(leaders, retimed.finalists, rounds)]
        if retimed.baseline is not None:
            b = retimed.baseline
            done.baseline[device] = {"latency_ms": b.median_ms, "latency_p20_ms": b.p20_ms,
                                     "latency_p80_ms": b.p80_ms, "of": retimed.baseline_of}
        winners[device] = pick(leaders, retimed.finalists, rounds)
    if winners:
        tally.set_best(winners)
    return done


def pick(leaders: list[Best], timings: list[Timing], rounds: list[int]) -> Best:
    """The re-timed fastest of those timed in every round (storage.best_file's
    raced_through), with its re-timed latency."""
    ran = [(b, t) for b, t, full in zip(leaders, timings, raced_through(rounds)) if full]
    leader, timing = min(ran, key=lambda p: (p[1].median_ms, p[0].index))
    return Best(leader.index, leader.config, timing.median_ms, leader.device)


def _one_pass(b: Best, device: str) -> dict[str, Any]:
    """A finalist that was not re-timed (on the interpreter): its one pass's time."""
    return {"index": b.index, "config": b.config, "device": device,
            "sweep_latency_ms": b.latency_ms, "latency_ms": b.latency_ms, "retimed": False}


def _distinct_programs(leaders: list[Best], options: list[str]) -> list[Best]:
    """The first of the leaders for each config that differs in more than these options."""
    seen: set[str] = set()
    kept = []
    for best in leaders:
        key = canonical_json({k: v for k, v in best.config.items() if k not in options})
        if key not in seen:
            seen.add(key)
            kept.append(best)
    return kept
