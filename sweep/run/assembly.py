"""Assembling a session's driver: what is left to run (the journal's records on resume,
`--retry` and a search's pruned rows set aside), the search replayed to where it ended,
the order and compile limit, the workers' settings and the driver's limits — everything
decided before the first trial is handed out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

from actors.backends import traits
from actors.protocol import WorkerSettings
from storage.journal import read_attempts
from storage.records import PRUNED, TrialRecord
from sweep.console import say
from sweep.engines.runtime import Placement
from sweep.results.tally import Tally
from sweep.run import rundir
from sweep.run.contracts import Limits, Work
from sweep.run.rundir import Loaded, RunDir
from sweep.search.per_problem import search_strategy
from sweep.search.scheduling import AdaptiveLimit, compile_order
from sweep.search.strategies import Search, SearchPlan
from sweep.spec import LAUNCH_OPTIONS, Spec, SpecError
from sweep.spec.space import Space

# Batches big enough that Ray's per-call cost stays small next to the work they carry.
TARGET_BATCH_S = 0.05
DEPTH = 2  # batches in flight per worker


@dataclass
class Assembly:
    """What the driver is handed (work: its tally, what the journal holds that counts and
    on from there), and what the session needs of it afterwards."""

    work: Work
    pruned_before: pa.Table | None  # a search's pruned rows, when resuming
    search: Search | None
    settings: WorkerSettings
    replay_cache: str | None  # a directory to remove once the run ends
    done_before: int = 0  # trials the journal held when this session began


@dataclass(frozen=True)
class Start:
    """Where a session's run begins: its journal read back (None: a new run), the statuses
    `--retry` runs again, a search's plan, the trials it hands out at most, and every
    config in compile order (a new run's, computed once, perhaps before it is asked for)."""

    loaded: Loaded | None
    retry: frozenset[str]
    plan: SearchPlan | None
    max_trials: int | None
    full_order: Callable[[], list[int]]


def assemble(run: RunDir, spec: Spec, space: Space, start: Start, backend: str,
             placement: Placement, prestarted: dict[str, tuple[str, str, int]],
             err: Console) -> Assembly:
    loaded, retry, plan = start.loaded, start.retry, start.plan
    tally, done, spent, deaths, records, pruned_before = _resumed(
        run, spec, space, loaded, retry, err)
    search = _replayed_search(spec, space, records, retry, plan, run.path, err)
    compiles = placement.compile_workers > 0
    feed = None
    if search is not None:
        def feed(records: list[TrialRecord]) -> list[int]:
            search.observe(records)
            new = search.advance()
            return compile_order(space, new) if compiles and new else new

        todo = feed([])
    else:
        todo = np.setdiff1d(np.arange(len(space)), done, assume_unique=True).tolist()
    compile_limit = None
    if compiles:
        # The likely-slowest compiles go first, so that they are not the sweep's tail.
        if search is None:
            todo = start.full_order() if len(todo) == len(space) else \
                compile_order(space, todo)
        compile_limit = _compile_limit(spec, loaded, retry)
    settings = replace(
        worker_settings(spec, backend),
        compile_workers=placement.compile_workers,
        compile_timeout_s=compile_limit.fixed_s if compile_limit else spec.run.compile_limit_s,
        compile_limit_auto=compile_limit.adaptive if compile_limit else False,
        prestarted=prestarted)
    # Replayed workers share a directory that stands in for Triton's on-disk cache.
    replay_cache = tempfile.mkdtemp(prefix="sweep-replay-") if backend == "replay" else None
    if replay_cache:
        settings = replace(settings, replay={**settings.replay, "cache_dir": replay_cache})
    limits = _limits(spec, backend, placement, compile_limit, start.max_trials)
    return Assembly(Work(space, tally, todo, spent, deaths, limits, placement.workers,
                         placement.kinds, compile_limit, feed),
                    pruned_before, search, settings, replay_cache, tally.done)


def _resumed(run: RunDir, spec: Spec, space: Space, loaded: Loaded | None,
             retry: frozenset[str], err: Console
             ) -> tuple[Tally, Any, dict[int, int], dict[int, int], pa.Table | None,
                        pa.Table | None]:
    """The tally, done indices, attempts spent and deaths a session goes on from, the
    records that count (None: a new run) and a search's pruned rows (decided again)."""
    tally = Tally(total=len(space), starts=space.starts)
    done = np.empty(0, int)
    spent, deaths = read_attempts(run.attempts, rundir.record_check(spec, space))
    if loaded is None:
        return tally, done, spent, deaths, None, None
    records = loaded.records
    pruned_before = None
    again = retried(loaded, retry)
    if again is not None:
        # Their next attempt follows the recorded one, and supersedes it.
        records = records.filter(pc.invert(retry_mask(records, retry)))
        for i, attempt in zip(again.column("index").to_pylist(),
                              again.column("attempt").to_pylist()):
            spent[i] = max(spent.get(i, 0), attempt)
            deaths.pop(i, None)  # a retried crash gets its retries again
        say(err, f"retrying {again.num_rows} configs recorded {' or '.join(sorted(retry))}")
    if not spec.search.exhaustive:
        # A search decides its pruned rows again from its journal: the same way, unless a
        # retry changed an outcome (then a config it now runs supersedes its row).
        pruned = pc.equal(records.column("status"), PRUNED)
        pruned_before = records.filter(pruned)
        for i, attempt in zip(pruned_before.column("index").to_pylist(),
                              pruned_before.column("attempt").to_pylist()):
            spent[i] = max(spent.get(i, 0), attempt)
        records = records.filter(pc.invert(pruned))
    tally = Tally.from_journal(len(space), records, space.starts)
    return tally, records.column("index").to_numpy(), spent, deaths, records, pruned_before


def retry_mask(records: pa.Table, retry: frozenset[str]) -> Any:
    return pc.is_in(records.column("status"), value_set=pa.array(sorted(retry)))


def retried(loaded: Loaded, retry: frozenset[str]) -> pa.Table | None:
    """The records `--retry` asks to run again, if any."""
    if not retry:
        return None
    again = loaded.records.filter(retry_mask(loaded.records, retry))
    return again if again.num_rows else None


def _replayed_search(spec: Spec, space: Space, records: pa.Table | None,
                     retry: frozenset[str], plan: SearchPlan | None, path: Path,
                     err: Console) -> Search | None:
    """The run's search, replayed to where its journal ends; None for an exhaustive run,
    or while `--retry pruned` runs what a search left out."""
    options = spec.search
    if options.exhaustive:
        return None
    if "pruned" in retry:
        say(err, "--retry pruned: the configs the search left out run now, all of them")
        return None
    if plan is None:
        raise SpecError(f"{path}: {rundir.META} has no record of the run's search "
                        "(its batch size and warm start); start a new run")
    known: dict[int, float | None] = {}
    if records is not None:
        ran = records.filter(pc.not_equal(records.column("status"), PRUNED))
        statuses = ran.column("status").to_pylist()
        latencies = ran.column("latency_ms").to_pylist()
        known = {i: (lat if st == "ok" else None) for i, st, lat in
                 zip(ran.column("index").to_pylist(), statuses, latencies)}
    return Search(search_strategy(space, options, plan.batch, plan.warm), known)


def _compile_limit(spec: Spec, loaded: Loaded | None,
                   retry: frozenset[str]) -> AdaptiveLimit:
    if retry:  # what a limit stopped is given the trial timeout this time
        return AdaptiveLimit(spec.run.trial_timeout_s, adaptive=False)
    return AdaptiveLimit(
        spec.run.compile_limit_s, adaptive=spec.run.compile_timeout_s == "auto",
        seen=zip(loaded.records.column("status").to_pylist(),
                 loaded.records.column("compile_ms").to_pylist()) if loaded else ())


def _limits(spec: Spec, backend: str, placement: Placement,
            compile_limit: AdaptiveLimit | None, max_trials: int | None) -> Limits:
    return Limits(
        trial_timeout_s=spec.run.trial_timeout_s, max_retries=spec.run.max_retries,
        drain_s=spec.run.drain_s, snapshot_every_s=spec.run.snapshot_every_s,
        batch_size=_batch_size(spec, backend, placement), depth=DEPTH,
        max_trials=max_trials, start_timeout_s=spec.run.start_timeout_s,
        # On an H200 a slow compile (6 s) outlasts a hundred trials: idle compile
        # processes may look four pools' worth down the queue.
        hint_span=4 * placement.compile_workers,
        announced=placement.compile_workers > 0,
        compile_wait_s=compile_limit.fixed_s if compile_limit else spec.run.compile_limit_s)


def worker_settings(spec: Spec, backend: str) -> WorkerSettings:
    return WorkerSettings(
        backend=backend, kernel=spec.kernel, problem=dict(spec.each_problem()[0]),
        trial_timing=spec.timing.per_config(spec.run.finalists),
        finalist_timing=(spec.timing.warmup_ms, spec.timing.rep_ms),
        screen=spec.timing.screens(spec.run.finalists),
        tolerance=(spec.validation.rtol, spec.validation.atol) if spec.validation else None,
        seed=spec.run.seed,
        simulate={k: v for k, v in vars(spec.simulate).items()
                  if k not in ("workers", "devices", "resources")},
        compile_timeout_s=spec.run.compile_limit_s,
        compile_limit_auto=spec.run.compile_timeout_s == "auto",
        kernel_path=str(Path.cwd()),
        replay={"table": spec.replay.table, "time_scale": spec.replay.time_scale},
        run=spec.fingerprint, fixed=dict(spec.fixed), problem_keys=spec.problem_keys)


def _batch_size(spec: Spec, backend: str, placement: Placement) -> int:
    if traits(backend).compiles_ahead:
        # Enough configs per batch that the compile pool works ahead of the GPU.
        return 2 * max(1, placement.compile_workers)
    if traits(backend).interpreted:
        return 1  # interpreted trials take far longer than a Ray round trip
    per_trial_s = max(spec.simulate.trial_ms, 0.05) / 1e3
    return int(min(1024, max(1, TARGET_BATCH_S / per_trial_s)))


def interpreted_options(spec: Spec, backend: str) -> list[str]:
    """Launch options the space varies, on the interpreter, which ignores them."""
    if not traits(backend).interpreted:
        return []
    return [k for k in LAUNCH_OPTIONS if len(spec.every_space.get(k, ())) > 1]
