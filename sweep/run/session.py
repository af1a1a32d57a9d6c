"""One invocation of `sweep run` or `sweep resume`: validate, lock, join Ray, drive,
finalize.

Everything that can be refused (spec, run directory, fingerprint) is checked before Ray
starts, with the run directory locked (storage/lock.py) from before it is first read to
the end; a signal at any point from start-up to the final write ends in a clean stop.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console

from actors.worker import WorkerSettings
from storage import cache
from storage.journal import (
    Journal,
    append_records,
    read_attempts,
)
from storage.lock import LOCK_NAME, RunDirLock
from storage.readback import ReadBackError, open_regular, printable
from storage.records import PRUNED, TrialRecord, canonical_json
from storage.snapshot import (
    Best,
    SnapshotError,
    read_best,
    read_snapshot,
    write_best,
    write_snapshot,
)
from sweep import EXIT_FAILED, EXIT_NONE_WORKED, EXIT_OK
from sweep.engines import machine
from sweep.engines.prestart import Prestart
from sweep.engines.runtime import ClusterLost, ConnectAbandoned, Engine, Placement, RetimeAbandoned
from sweep.report.text import common_errors, print_summary, resume_command, say
from sweep.results.tally import LEADERS, Tally
from sweep.run import rundir
from sweep.run.driver import Driver, DriverFailed, Limits, Observer
from sweep.run.progress import ProgressReporter
from sweep.run.rundir import Loaded, RunDir, RunLog
from sweep.run.stop import StopController
from sweep.search.scheduling import AdaptiveLimit, compile_order
from sweep.search.strategies import Search, SearchPlan, batch_size, rungs, strategy
from sweep.search.warm_start import indices_of, warm_start
from sweep.spec import (
    LAUNCH_OPTIONS,
    Spec,
    SpecError,
    check_dtype_for_backend,
    load_spec,
    read_spec_text,
)
from sweep.spec.space import Space
from sweep_kernels import BUILTIN, file_digest, origin_of

PRUNE_CHUNK = 10_000  # pruned rows journaled at once
IMPORT_NOTICE_S = 2.0  # a kernel import that takes longer is said while it runs
# Batches big enough that Ray's per-call cost stays small next to the work they carry.
TARGET_BATCH_S = 0.05
DEPTH = 2  # batches in flight per worker
# Errors of the run directory's filesystem, reported as one line (exit 1), not a traceback.
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG,
                  errno.EACCES, errno.EPERM}


def storage_error(e: BaseException, directory: Path) -> bool:
    """A failed write in the run directory (a full disk, say): one line and exit 1. Any
    other error is a bug and keeps its traceback."""
    if not isinstance(e, OSError) or e.errno not in STORAGE_ERRNOS or not e.filename:
        return False
    return Path(os.fsdecode(e.filename)).absolute().is_relative_to(directory)


def checked_path(path: Path, what: str) -> Path:
    """Paths end up in JSON, Parquet metadata and messages: they must be text."""
    try:
        str(path).encode()
    except UnicodeEncodeError:
        raise SpecError(f"{what}: {str(path)!a} is not valid UTF-8; use another name") from None
    return path


def run_path(path: Path, what: str) -> Path:
    """A run directory's path, absolute: Ray's start changes the working directory for a
    moment (see cluster.py) while another thread may be reading the run directory."""
    return checked_path(path, what).absolute()


@dataclass(frozen=True)
class Request:
    """What one `sweep run` or `sweep resume` (or a call of the Python API) asks for
    besides the spec or run directory."""

    address: str | None = None  # the Ray cluster (see cluster.target)
    runtime: str | None = None  # --runtime: local | ray | auto (None: the spec's run.runtime)
    max_trials: int | None = None  # at most this many trials, then stop resumably
    time_budget_s: float | None = None  # stop resumably this long after the call began
    cache_partial: bool = False  # an interrupted run's best goes to the cache, as partial
    force: bool = False  # tune even when the cache holds a complete run's best
    observers: tuple[Observer, ...] = ()  # told of each finished trial (see driver.py)


@dataclass
class Ending:
    """How the session ended, beyond its exit code: for the Python API's result."""

    state: str  # a snapshot state; "cached": nothing ran, the cache answered
    cached: list[cache.CacheEntry] = field(default_factory=list)


@dataclass
class Session:
    spec: Spec
    space: Space
    path: Path
    lock: RunDirLock
    meta: dict[str, Any] | None  # the run's run.json when resuming
    snapshot_says_complete: bool = False
    earlier: list[list[float]] = field(default_factory=list)  # see Snapshot.sessions
    created: list[Path] = field(default_factory=list)  # directories this session made
    # A new run's spec with its kernel imported: torch and the kernel module take seconds
    # to import, so that happens while Ray starts (see _execute).
    full_spec: Future[Spec] | None = None
    importer: Callable[[], Future[Spec]] | None = None  # begins that import (a new run's)
    timeline: dict[str, float] = field(default_factory=dict)  # see Snapshot.timeline
    prestart: Prestart | None = None  # what a local GPU run began before Ray was up
    # `sweep resume --retry`: recorded statuses whose configs run again (a new attempt,
    # which supersedes the record), compiles limited by run.trial_timeout_s alone
    retry: frozenset[str] = frozenset()
    order: list[int] | None = None  # every config in compile order, once computed
    # What a search decided when the run was created (see rundir.create); from run.json
    # on resume.
    meta_search: SearchPlan | None = None
    ending: Ending | None = None  # set once execute() has decided
    # Cache entries that would have answered this sweep but for their run directory, gone.
    gone: list[cache.CacheEntry] = field(default_factory=list)

    @classmethod
    def start(cls, spec_path: Path, out: Path | None, backend: str | None,
              command: str, replace_run: bool = False,
              say_line: Callable[[str], None] = lambda line: None) -> Session:
        """replace_run (--force): a run already in `out` is moved aside first, never
        deleted (after a kernel edit, resume refuses it and this is the way on)."""
        spec_path = checked_path(spec_path, "spec")
        # Everything the file alone decides is checked now; the kernel module is imported
        # (and the spec checked against it) on another thread from here on.
        text = read_spec_text(spec_path)
        spec = load_spec(spec_path, backend=backend, import_kernel=False, text=text)
        space = spec.expand()
        path = run_path(out or rundir.default_out(spec), "--out")
        try:
            if path.exists() and not path.is_dir():
                raise SpecError(f"--out: {path} exists and is not a directory")
            created = _make_dirs(path)
        except OSError as e:
            raise SpecError(f"--out: cannot create {path} ({e.strerror or e})") from None
        lock = _lock(path, command)
        try:
            run = RunDir(path)
            if run.meta.exists() and replace_run:
                aside = _move_aside(run)
                say_line(f"{path} held a run: moved it to {aside}, whole; starting anew")
            if run.meta.exists():
                raise SpecError(f"{path}: already holds a run; continue it with: "
                                f"{resume_command(path)}, or start anew there with --force "
                                "(which moves it aside)")
            if run.holds_run():
                raise SpecError(f"{path}: holds a run's files but no {rundir.META} (a start "
                                "cut short, or files of something else); choose another "
                                "--out, or remove them")
        except BaseException:
            _give_back(lock, created)
            raise
        # Read from this directory, not the current one: connecting to Ray changes that
        # for a moment (see cluster.py) while this thread may be reading.
        here = Path.cwd()
        def importer() -> Future[Spec]:
            full_spec = _in_background(lambda: load_spec(spec_path, backend=backend, cwd=here,
                                                         text=text))
            if spec.kernel not in BUILTIN:  # a package's import can take long: say so
                module = spec.kernel.partition(":")[0]
                _say_if_slow(full_spec, IMPORT_NOTICE_S, lambda: say_line(
                    f"importing {module} (the spec's kernel) to check the spec against it"))
            return full_spec

        return cls(spec, space, path, lock, None, created=created, importer=importer)

    @classmethod
    def reopen(cls, path: Path, err: Console, command: str) -> Session:
        path = run_path(path, "resume")
        try:
            if not path.is_dir():
                raise SpecError(f"{path}: no such run directory")
        except OSError as e:
            raise SpecError(f"{path}: cannot read ({e.strerror or e})") from None
        lock = _lock(path, command)
        try:
            run = RunDir(path)
            if not run.meta.exists():
                raise SpecError(f"{path}: not a sweep run directory (no {rundir.META})")
            return cls._reopen_locked(run, lock, err)
        except BaseException:
            lock.release(remove=True)
            raise

    @classmethod
    def _reopen_locked(cls, run: RunDir, lock: RunDirLock, err: Console) -> Session:
        path = run.path
        meta = rundir.read_meta(run)
        # The spec names a module to import, which runs its code: check the spec against
        # the run's record of it first, so a spec.yaml edited since names nothing new.
        try:  # the run's own copy: a FIFO or a device there is damage, never a hang
            os.close(open_regular(run.spec))
        except ReadBackError as e:
            raise SpecError(str(e)) from None
        except FileNotFoundError:
            pass  # read_spec_text says so
        text = read_spec_text(run.spec)
        declared = load_spec(run.spec, import_kernel=False, text=text).declared_fingerprint
        if declared != meta["declared"]:
            raise SpecError(f"{run.spec}: changed since this run started; start a new run "
                            "with sweep run")
        # The name may come from the spec file's name, which is spec.yaml here.
        spec = replace(load_spec(run.spec, text=text), name=meta["name"])
        if spec.fingerprint != meta["fingerprint"]:
            raise SpecError(f"{path}: the spec, kernel source or problem changed since this run "
                            f"started (fingerprint {meta['fingerprint']}, now "
                            f"{spec.fingerprint}); start a new run with sweep run")
        space = spec.expand()
        if len(space) != meta["total"]:
            raise SpecError(f"{path}: the space now expands to {len(space)} configs, "
                            f"the run has {meta['total']}")
        complete, earlier = False, []
        if run.snapshot.exists():
            try:
                snap = read_snapshot(run.snapshot)
                complete = snap.state == "complete"
                # A snapshot from before `sessions` existed knows its last session's start.
                start = snap.timeline.get("session_start")
                earlier = snap.sessions or ([[start, snap.written_at]] if start else [])
            except SnapshotError as e:
                say(err, f"warning: {e}; rebuilding the run from the journal")
        return cls(spec, space, path, lock, meta, complete, earlier,
                   meta_search=meta.get("search"))

    def execute(self, request: Request, stop: StopController, out: Console, err: Console,
                engine: Engine, started: float | None = None) -> int:
        """engine: where the workers run (sweep/engines/selection.py chooses one); started: when the
        command began (time.monotonic()), for the summary's time and the time budget."""
        try:
            return self._execute(request, stop, out, err, engine,
                                 started if started is not None else time.monotonic())
        except OSError as e:
            if not storage_error(e, self.path):
                raise
            then = (f"every trial acknowledged is in its journal. Make room, then: "
                    f"{resume_command(self.path)}") if RunDir(self.path).meta.exists() \
                else "nothing was kept. Make room and run it again"
            say(err, f"error: {self.path}: {e.strerror or e} while writing the run "
                     f"directory; {then}")
            return EXIT_FAILED
        finally:
            self.release()

    def release(self) -> None:
        """The run directory is given back (unlocked; directories made for a run that
        never started removed again)."""
        _give_back(self.lock, [] if RunDir(self.path).meta.exists() else self.created)

    def _execute(self, request: Request, stop: StopController, out: Console, err: Console,
                 engine: Engine, t0: float) -> int:
        self.timeline["session_start"] = time.time()
        run = RunDir(self.path)
        loaded = None
        if self.meta and self.snapshot_says_complete:
            loaded = rundir.load_records(run, self.spec, self.space)
            if loaded.recovered.num_rows:
                self._rejournal(run, loaded, err)
            if loaded.records.num_rows == len(self.space) and not self._retried(loaded):
                nothing = f"no config recorded {' or '.join(sorted(self.retry))}; " \
                    if self.retry else ""
                say(out, f"{self.path}: already complete ({len(self.space)} trials); "
                         + nothing + self._repair_complete(run, loaded))
                self.ending = Ending("complete")
                if not pc.any(pc.equal(loaded.records.column("status"), "ok")).as_py():
                    _print_errors(out, loaded.records)
                    return EXIT_NONE_WORKED
                return EXIT_OK
        # Reading a big journal and starting Ray both take seconds: do them side by side
        # (Ray must start on this, the main thread: its processes die with the thread).
        if not self.meta and not request.force:
            hits = self._answered_early(engine)
            if hits:
                _print_cached(out, self.spec, self.space, hits)
                self.ending = Ending("cached", cached=hits)
                return EXIT_OK
        self._begin_import()
        try:
            self._spec_refused()  # the kernel's import already found a mistake
            if not self.meta and engine.on_this_machine() and \
                    os.environ.get("SWEEP_PRESTART") != "0":
                self.prestart = self._prestart(engine)
            with ThreadPoolExecutor(1) as pool:
                loading = pool.submit(rundir.load_records, run, self.spec, self.space) \
                    if self.meta and loaded is None else None
                try:
                    engine.connect(lambda: stop.requested or _failed(self.full_spec),
                                   lambda message: say(err, message))
                except ConnectAbandoned as e:
                    self._spec_refused()  # a join given up for the spec's mistake
                    say(err, f"{e}; " + ("the run is unchanged" if self.meta
                                         else "nothing was written"))
                    return stop.exit_code
                finally:
                    stop.install()  # Ray may have replaced our handlers
                engine.divert_reports(run.ray_log if engine.name == "ray"
                                      else run.workers_log)
                self.timeline[f"{engine.name}_ready"] = time.time()
                if loading is not None:
                    loaded = loading.result()
                    if loaded.recovered.num_rows:
                        self._rejournal(run, loaded, err)
                if self.full_spec is not None:
                    self.spec = self.full_spec.result()
                    self.timeline["kernel_imported"] = time.time()
            backend = engine.resolve_backend(self.spec)
            if self.prestart and backend != self.prestart.backend:  # Ray found no GPU
                self.prestart.close()
                self.prestart = None
            check_dtype_for_backend(self.spec.path, self.spec.problem, backend)
            placement = engine.placement(self.spec, backend)  # may refuse the spec
            if self.meta and backend != self.meta["backend"]:
                raise SpecError(f"{self.path}: the run used backend {self.meta['backend']}, "
                                f"but this cluster resolves to {backend}; pass the same kind "
                                "of cluster")
            if not self.meta and not request.force and not stop.requested:
                hits = self._cached(engine, backend, placement, lambda: stop.requested)
                if hits:
                    _print_cached(out, self.spec, self.space, hits)
                    self.ending = Ending("cached", cached=hits)
                    return EXIT_OK
            if stop.requested and not self.meta:
                say(err, "stopped before the run started; nothing was written")
                return stop.exit_code
            budget = request.time_budget_s
            if not self.meta and budget is not None and time.monotonic() >= t0 + budget:
                say(err, f"the time budget of {budget:g} s was spent before the run started; "
                         "nothing was written")
                return EXIT_OK
            for entry in self.gone:
                say(err, f"the best-config cache has this sweep's best on "
                         f"{printable(entry.device)}, from {printable(entry.run_dir, 4096)}, "
                         "which is gone: tuning again")
            if not self.meta:
                _note_interpreted_options(self.spec, backend, err)
                self.meta_search = self._plan_search(backend, placement, err)
                rundir.create(run, self.spec, len(self.space), backend,
                              search=self.meta_search)
            return self._drive(run, engine, backend, placement, loaded, request, stop, out,
                               err, t0)
        finally:
            if self.prestart:  # what its launchers printed goes with the run, if one began
                self.prestart.close(run.workers_log if run.meta.exists() else None)
            engine.close()

    def _prestart(self, engine: Engine) -> Prestart | None:
        """Work begun before the kernel is imported here and the engine is up: a GPU's
        launchers and early compiles (a search's first configs depend on the cluster's
        size: then none compile early); under the interpreter on the local runtime, whose
        workers adopt them, each worker's launcher (which imports torch and the kernel)."""
        backend = self.spec.run.backend
        if backend in ("auto", "cuda") and machine.visible_gpus():
            return Prestart.begin(
                _worker_settings(self.spec, "cuda"),
                ((i, self.space.config(i)) for i in self._full_order())
                if self.spec.search.exhaustive else ())
        if backend in ("auto", "interpret") and engine.name == "local" and \
                machine.local_devices(backend) == ["cpu-interpreter"]:
            workers = engine.placement(self.spec, "interpret").workers
            return Prestart.begin_interpret(_worker_settings(self.spec, "interpret"), workers)
        return None

    def _early_compiles_end(self, limit: AdaptiveLimit | None) -> None:
        """The workers' pools are up: the early pool stops, and what it compiled while Ray
        started teaches the compile limit (the workers find those binaries in Triton's
        cache, in a few ms that say nothing of how long this kernel's compiles take)."""
        if self.prestart is not None:
            took = self.prestart.stop_compiling()
            if limit is not None:
                limit.observe_compiles(took)

    def _answering(self, candidates: list[cache.CacheEntry],
                   devices: list[tuple[str, dict[str, str]]]) -> list[cache.CacheEntry]:
        """cache.answering among the candidates whose run is still there: an answer names
        where its best came from, and with that gone there is nothing to inspect, so the
        sweep runs again. Those that would have answered but for that are kept in gone,
        for the run to say so."""
        here = [e for e in candidates if not e.run_gone]
        self.gone += [e for e in candidates if e.run_gone and e not in self.gone
                      and cache.answering([e], devices)]
        return cache.answering(here, devices)

    def _spec_refused(self) -> None:
        """Raise the spec's mistake that importing the kernel found, if it has."""
        if _failed(self.full_spec):
            assert self.full_spec is not None
            self.full_spec.result()

    def _retry_mask(self, records: pa.Table) -> Any:
        return pc.is_in(records.column("status"), value_set=pa.array(sorted(self.retry)))

    def _retried(self, loaded: Loaded) -> pa.Table | None:
        """The records `--retry` asks to run again, if any."""
        if not self.retry:
            return None
        again = loaded.records.filter(self._retry_mask(loaded.records))
        return again if again.num_rows else None

    def _full_order(self) -> list[int]:
        """Every config in the order to hand out (a new run's), computed once: before Ray
        starts for the early compiles, then for the driver's queue."""
        if self.order is None:
            self.order = compile_order(self.space, range(len(self.space)))
        return self.order

    def _repair_complete(self, run: RunDir, loaded: Loaded) -> str:
        """A complete run resumed again: nothing is run, and nothing intact is rewritten
        (best.json holds the finalists' re-timing, which the journal does not). What is
        missing or damaged is rebuilt: the table from the journal, best.json from the
        snapshot."""
        snap = read_snapshot(run.snapshot)
        rebuilt = []
        if not loaded.table_is_current or loaded.recovered.num_rows:
            rundir.write_trials(run, self.spec, self.space, "complete")
            rebuilt.append("trials.parquet")
        if read_best(run.best, self.spec.fingerprint) is None:
            write_best(run.best, snap.best, fingerprint=self.spec.fingerprint, partial=False,
                       finalists=snap.finalists, by_device=snap.by_device,
                       baseline=snap.baseline)
            rebuilt.append("best.json")
        return "rebuilt " + " and ".join(rebuilt) if rebuilt else "nothing to do"

    def _rejournal(self, run: RunDir, loaded: Loaded, err: Console) -> None:
        """Rows only trials.parquet held (its journal was replaced by an older or other
        one) go back into the journal, which stays the one durable truth."""
        with Journal(run.journal) as journal:
            append_records(journal, rundir.rows_as_records(loaded.recovered),
                           self.spec.fingerprint)
        say(err, f"recovered {loaded.recovered.num_rows} trials that only trials.parquet "
                 "held into the journal")

    def _cache_best(self, tally: Tally, backend: str, partial: bool, err: Console,
                    versions: Mapping[str, Mapping[str, str]]) -> None:
        """An entry per device type: a config tuned on one type says little of another.
        A better best cached before (by another run) stays."""
        spec = self.spec
        if spec.validation is None:
            say(err, "validation is off: the best-config cache takes only validated bests")
            return
        here = cache.library_versions()  # the workers' unless none came up (all done before)
        noise = _interpreted_options(spec, backend)
        try:
            for best in tally.by_device.values():
                # The interpreter ignores launch options: a pick among them is noise.
                config = {k: v for k, v in best.config.items() if k not in noise}
                kept, _ = cache.store(cache.CacheEntry(
                    kernel=spec.kernel, kernel_source=spec.kernel_source,
                    problem=dict(spec.problem), backend=backend, device=best.device,
                    config=config, latency_ms=best.latency_ms,
                    fingerprint=spec.fingerprint, run_dir=str(self.path.resolve()),
                    partial=partial, written_at=time.time(),
                    versions=versions.get(best.device) or here,
                    fixed=dict(spec.fixed_as_written), runs=(spec.fingerprint,),
                    declared=(spec.declared_fingerprint,), host=socket.gethostname(),
                    sources=dict(spec.kernel_files)),
                    unfit=lambda held: not _fits(spec, held))
                if kept.run_dir != str(self.path.resolve()):
                    say(err, f"the best-config cache keeps its entry from "
                             f"{printable(kept.run_dir, 4096)}"
                             f"{' (partial)' if kept.partial else ''}: {kept.latency_ms:.4g}"
                             f" ms on {printable(kept.device)}, this run's best "
                             f"{best.latency_ms:.4g} ms")
        except OSError as e:  # the run itself is done and written; only the cache missed it
            say(err, f"warning: the best-config cache was not updated ({e.strerror or e})")

    def _cached(self, engine: Engine, backend: str, placement: Placement,
                stop_requested: Callable[[], bool]) -> list[cache.CacheEntry]:
        """The cached best on each device this run would tune on, if this very sweep (its
        fingerprint) completed on each before, with these torch and Triton versions; else
        nothing. Simulate and replay runs measure this tool, not a kernel: they always
        run."""
        candidates = _candidates(self.spec, backend)
        if not candidates:
            return []
        if backend == "interpret":
            devices: list[tuple[str, dict[str, str]]] | None = \
                [("cpu-interpreter", cache.library_versions())]
        else:  # only now, with an answer likely: it starts a process on a GPU
            devices = engine.device_names(sorted(set(placement.kinds)) or [""], stop_requested)
        return self._answering(candidates, devices or [])

    def _answered_early(self, engine: Engine) -> list[cache.CacheEntry]:
        """The cache's answer before the kernel is imported and the engine starts, where
        this machine alone decides the devices (workers on this machine, no device types
        chosen): from files alone where the entries recorded the kernel's source files,
        which are unchanged (milliseconds: neither torch nor the kernel is imported);
        else, where a complete sweep with this spec's declared fingerprint is on record,
        by importing the kernel now (which costs only a run that is answered)."""
        spec = self.spec
        if self.importer is None or not engine.on_this_machine() or \
                spec.run.accelerator_types is not None:
            return []
        devices = machine.local_devices(spec.run.backend)
        if devices is None:
            return []
        backend = "interpret" if devices == ["cpu-interpreter"] else "cuda"
        here = cache.library_versions()  # the workers' too: this machine, this Python
        on = [(d, here) for d in devices]
        origin = origin_of(spec.kernel, str(Path.cwd()))
        hits = self._answering([e for e in cache.answered_by_files(
            spec.kernel, spec.declared_fingerprint, backend, origin, file_digest)
            if _fits(spec, e)], on) if origin else []
        if hits or not cache.declared_somewhere(spec.kernel, spec.declared_fingerprint):
            return hits
        self._begin_import()
        assert self.full_spec is not None
        full = self.full_spec.result()
        hits = self._answering(_candidates(full, backend), on)
        if hits:
            self.spec = full
        return hits

    def _begin_import(self) -> None:
        """A new run's kernel import begins (on a thread), once."""
        if self.full_spec is None and self.importer is not None:
            self.full_spec = self.importer()

    def _drive(self, run: RunDir, engine: Engine, backend: str, placement: Placement,
               loaded: Loaded | None,
               request: Request, stop: StopController, out: Console, err: Console,
               t0: float) -> int:
        spec = self.spec
        tally = Tally(total=len(self.space))
        done = np.empty(0, int)
        pruned_before: pa.Table | None = None  # a search's pruned rows, when resuming
        spent, deaths = read_attempts(run.attempts, rundir.record_check(spec, self.space))
        if loaded is not None:
            records = loaded.records
            again = self._retried(loaded)
            if again is not None:
                # Their next attempt follows the recorded one, and supersedes it.
                records = records.filter(pc.invert(self._retry_mask(records)))
                for i, attempt in zip(again.column("index").to_pylist(),
                                      again.column("attempt").to_pylist()):
                    spent[i] = max(spent.get(i, 0), attempt)
                    deaths.pop(i, None)  # a retried crash gets its retries again
                say(err, f"retrying {again.num_rows} configs recorded "
                         f"{' or '.join(sorted(self.retry))}")
            if not spec.search.exhaustive:
                # A search decides its pruned rows again from its journal: the same way,
                # unless a retry changed an outcome (then a config it now runs supersedes
                # its row).
                pruned = pc.equal(records.column("status"), PRUNED)
                pruned_before = records.filter(pruned)
                for i, attempt in zip(pruned_before.column("index").to_pylist(),
                                      pruned_before.column("attempt").to_pylist()):
                    spent[i] = max(spent.get(i, 0), attempt)
                records = records.filter(pc.invert(pruned))
            tally = Tally.from_journal(len(self.space), records)
            done = records.column("index").to_numpy()
        done_before = tally.done
        compiles = placement.compile_workers > 0
        search = self._search(records if loaded is not None else None, placement, err)
        feed = None
        if search is not None:
            def feed(records: list[TrialRecord]) -> list[int]:
                search.observe(records)
                new = search.advance()
                return compile_order(self.space, new) if compiles and new else new

            todo = feed([])
        else:
            todo = np.setdiff1d(np.arange(len(self.space)), done, assume_unique=True).tolist()
        compile_limit = None
        if compiles:
            # The likely-slowest compiles go first, so that they are not the sweep's tail.
            if search is None:
                todo = self._full_order() if len(todo) == len(self.space) \
                    else compile_order(self.space, todo)
            compile_limit = AdaptiveLimit(
                spec.run.compile_limit_s, adaptive=spec.run.compile_timeout_s == "auto",
                seen=zip(loaded.records.column("status").to_pylist(),
                         loaded.records.column("compile_ms").to_pylist()) if loaded else ())
            if self.retry:  # what a limit stopped is given the trial timeout this time
                compile_limit = AdaptiveLimit(spec.run.trial_timeout_s, adaptive=False)
        settings = replace(
            _worker_settings(spec, backend),
            compile_workers=placement.compile_workers,
            compile_timeout_s=compile_limit.fixed_s if compile_limit else spec.run.compile_limit_s,
            prestarted=self.prestart.launchers if self.prestart else {})
        # Replayed workers share a directory that stands in for Triton's on-disk cache.
        replay_cache = tempfile.mkdtemp(prefix="sweep-replay-") if backend == "replay" else None
        if replay_cache:
            settings = replace(settings, replay={**settings.replay, "cache_dir": replay_cache})
        limits = Limits(
            trial_timeout_s=spec.run.trial_timeout_s, max_retries=spec.run.max_retries,
            drain_s=spec.run.drain_s, snapshot_every_s=spec.run.snapshot_every_s,
            batch_size=_batch_size(spec, backend, placement), depth=DEPTH,
            max_trials=request.max_trials, start_timeout_s=spec.run.start_timeout_s,
            # On an H200 a slow compile (6 s) outlasts a hundred trials: idle compile
            # processes may look four pools' worth down the queue.
            hint_span=4 * placement.compile_workers,
            announced=compiles,
            compile_wait_s=compile_limit.fixed_s if compile_limit else spec.run.compile_limit_s)

        checkpoint = rundir.TableCheckpoint(run, spec, self.space)

        def snapshot() -> None:
            write_snapshot(run.snapshot, rundir.snapshot_of(
                spec, tally, "running", timeline=self.timeline, earlier=self.earlier))
            checkpoint.maybe_start()

        budget = request.time_budget_s
        deadline = t0 + budget if budget is not None else None

        def should_stop() -> bool:
            return stop.requested or (deadline is not None and time.monotonic() >= deadline)

        state = "failed"
        finalists: list[dict[str, Any]] = []
        baseline: dict[str, dict[str, Any]] = {}
        driver = None
        # A stop before or while the finalists were re-timed leaves a best picked by one
        # noisy pass: not one to cache as final.
        unsettled = False
        in_flight = True  # an exception is on its way out of the try below
        lost: ClusterLost | None = None
        try:
            write_snapshot(run.snapshot, rundir.snapshot_of(
                spec, tally, "running", timeline=self.timeline, earlier=self.earlier))
            with RunLog(run, spec.fingerprint) as log, \
                    ProgressReporter(tally, err, expected=spec.search.most(len(self.space))
                                     if search is not None else None) as progress:
                runtime = engine.runtime(settings, placement, limits.max_batches)
                driver = Driver(self.space, runtime, placement.workers, limits, log, tally,
                                todo, spent, deaths, should_stop=should_stop,
                                on_snapshot=snapshot,
                                observers=[progress, *request.observers],
                                compile_limit=compile_limit,
                                on_compilers_up=lambda: self._early_compiles_end(
                                    compile_limit), kinds=placement.kinds,
                                feed=feed)
                try:
                    ending = driver.run()
                    if search is not None and ending == "complete" and search.settled() \
                            and not should_stop():
                        self._prune(search, pruned_before, spent, log, tally, progress)
                    self.timeline.update(driver.timeline, trials_done=time.time())
                    if ending == "complete" and not should_stop():
                        promoted = self._halve(run, driver, progress, should_stop) \
                            if spec.search.strategy == "halving" else None
                    if ending == "complete" and not should_stop():
                        finalists, baseline, unsettled = self._retime_finalists(
                            driver, tally, progress, should_stop, backend, promoted)
                        self.timeline["finalists_done"] = time.time()
                    elif ending == "complete":  # stopped as the last trial or a rung ended
                        unsettled = any(len(tally.leaders(spec.run.finalists, d)) >= 2
                                        for d in tally.devices)
                finally:
                    driver.close()
            state = "complete" if tally.done == tally.total else "interrupted"
            in_flight = False
        except DriverFailed as e:
            say(err, f"error: {e}")
            in_flight = False
        except ClusterLost as e:  # driver.run() has closed its workers, committed records
            engine.mark_lost()
            state, lost, in_flight = "interrupted", e, False
        except KeyboardInterrupt:  # an API caller's second Ctrl+C: written as a stop, then on
            state = "interrupted"
            raise
        finally:
            if replay_cache:
                shutil.rmtree(replay_cache, ignore_errors=True)
            checkpoint.wait()
            first = driver.first_dispatch_at if driver else None
            try:
                rundir.finalize(run, spec, self.space, tally, state,  # type: ignore[arg-type]
                                finalists, first, self.timeline, baseline=baseline,
                                earlier=self.earlier)
            except OSError as e:
                if not storage_error(e, self.path) or not in_flight:
                    raise  # alone, a full disk is one line and exit 1 (see execute)
                # Already failing for the same reason: the artefacts on disk stay the last
                # complete ones, and resume rebuilds them from the journal.
        # A retry stopped partway goes on only if asked again: say so in the hint.
        again = f" --retry {','.join(sorted(self.retry))}" if self.retry else ""
        spent_budget = state == "interrupted" and not stop.requested and \
            deadline is not None and time.monotonic() >= deadline
        self.ending = Ending(state)
        # Cached before the summary is printed: a closed stdout (`| head -1`) must not
        # lose it.
        partial = state != "complete" or unsettled
        if tally.best and state != "failed" and lost is None and \
                (not partial or request.cache_partial):
            self._cache_best(tally, backend, partial=partial, err=err,
                             versions=driver.versions if driver else {})
        if spent_budget:
            say(err, f"the time budget of {budget:g} s is spent; the run stops resumably")
        if state == "complete" and unsettled:
            say(err, "stopped before the fastest configs were re-timed side by side: the best "
                     "is one pass's, so the best-config cache does not take it (--force "
                     "tunes again)")
        print_summary(out, spec.name, self.path, state, tally, time.monotonic() - t0, again,
                      spec.search.most(len(self.space)) if "pruned" not in self.retry
                      else None)
        if request.max_trials is not None and state == "interrupted" and \
                driver is not None and driver.dispatched >= request.max_trials:
            # Each session counts its own: a resume with --max-trials 100 runs 100 more.
            say(out, f"  --max-trials {request.max_trials}: this session ran "
                     f"{tally.done - done_before} of them; each session counts its own")
        if state == "complete" and tally.best is None:
            _print_errors(out, pq.read_table(run.trials, columns=["index", "status", "error"]))
            return EXIT_NONE_WORKED
        if lost is not None:
            say(err, f"error: {lost}; every finished trial is written. Resume with: "
                     f"{resume_command(self.path)}")
            return EXIT_FAILED
        if state == "failed":
            return EXIT_FAILED
        # A signal that lands during the final write of a finished run changes nothing;
        # one that cut its rungs or finalists short stopped the run's pick.
        return stop.exit_code if stop.requested and (state != "complete" or unsettled) \
            else EXIT_OK

    def _plan_search(self, backend: str, placement: Placement,
                     err: Console) -> SearchPlan | None:
        """A new run's search decisions that must not change on resume: its batch size
        (from this cluster's size) and its warm start (from the cache as it is now)."""
        options = self.spec.search
        if options.exhaustive:
            return None
        batch = batch_size(options, placement.workers, placement.compile_workers)
        warm = warm_start(self.spec, self.space, backend)
        what = f"batches of {batch}" if options.strategy == "guided" else \
            f"a first rung of {options.sample:g} of the space"
        say(err, f"search: {options.strategy}, {what}" + (
            f"; warm start: {len(warm.indices)} configs from {warm.source}" if warm else ""))
        return SearchPlan(batch, tuple(warm.indices) if warm else (),
                          warm.source if warm else None)

    def _search(self, records: pa.Table | None, placement: Placement,
                err: Console) -> Search | None:
        """The run's search, replayed to where its journal ends; None for an exhaustive
        run, or while `--retry pruned` runs what a search left out."""
        options = self.spec.search
        if options.exhaustive:
            return None
        if "pruned" in self.retry:
            say(err, "--retry pruned: the configs the search left out run now, all of them")
            return None
        plan = self.meta_search
        if plan is None:
            raise SpecError(f"{self.path}: {rundir.META} has no record of the run's search "
                            "(its batch size and warm start); start a new run")
        known: dict[int, float | None] = {}
        if records is not None:
            ran = records.filter(pc.not_equal(records.column("status"), PRUNED))
            statuses = ran.column("status").to_pylist()
            latencies = ran.column("latency_ms").to_pylist()
            known = {i: (lat if st == "ok" else None) for i, st, lat in
                     zip(ran.column("index").to_pylist(), statuses, latencies)}
        return Search(strategy(self.space, options, plan.batch, plan.warm), known)

    def _prune(self, search: Search, before: pa.Table | None, spent: dict[int, int],
               log: RunLog, tally: Tally, progress: ProgressReporter) -> None:
        """The search is over: every config it did not run gets its `pruned` row, durably,
        as a trial's record would; one pruned before keeps its row (and counts again)."""
        pruned = search.pruned(len(self.space))
        kept: set[int] = set()
        if before is not None:  # those it prunes again; one it ran since is superseded
            still = before.filter(pc.is_in(before.column("index"), pa.array(pruned, pa.int64())))
            kept = set(still.column("index").to_pylist())
            tally.add(rundir.rows_as_records(still))
        now = time.time()
        todo = [i for i in pruned if i not in kept]
        for start in range(0, len(todo), PRUNE_CHUNK):  # a big space's, a chunk at a time
            records = [TrialRecord(
                index=i, config=self.space.config(i), status=PRUNED, latency_ms=None,
                latency_p20_ms=None, latency_p80_ms=None, validation="skipped", error=None,
                compile_ms=None, device="", node="", worker="",
                attempt=spent.get(i, 0) + 1, started_at=now, finished_at=now)
                for i in todo[start:start + PRUNE_CHUNK]]
            log.commit(records, [], [None] * len(records))
            tally.add(records)
        if todo or kept:
            progress.on_event(f"the {self.spec.search.strategy} search is over after "
                              f"{len(search.known)} configs; "
                              f"{len(todo) + len(kept)} pruned")

    def _halve(self, run: RunDir, driver: Driver, progress: ProgressReporter,
               should_stop: Callable[[], bool]) -> dict[str, list[Best]] | None:
        """Successive halving's rungs after its screened sample: on each device type,
        1/eta of the configs that worked are re-timed carefully across every worker at
        once, then 1/eta of those, down to the finalists, which are returned, fastest
        first (None: a rung failed or was stopped, the one pass's leaders stand)."""
        records = rundir.load_records(run, self.spec, self.space).records
        ok = records.filter(pc.equal(records.column("status"), "ok"))
        out: dict[str, list[Best]] = {}
        keep = max(1, self.spec.run.finalists)
        for device in sorted(set(ok.column("device").to_pylist())):
            rows = ok.filter(pc.equal(ok.column("device"), device)).to_pylist()
            rung = [Best(r["index"], json.loads(r["config"]), r["latency_ms"], device)
                    for r in sorted(rows, key=lambda r: (r["latency_ms"], r["index"]))]
            for level, size in enumerate(rungs(len(rung), self.spec.search.eta, keep), 1):
                if should_stop():  # a fast backend's rungs end between two checks of it
                    return None
                rung = rung[:size]
                progress.on_event(f"rung {level}: re-timing the {len(rung)} fastest on "
                                  f"{device} carefully, on every worker at once")
                try:
                    timings = driver.retime_spread([b.config for b in rung], device)
                except (DriverFailed, RetimeAbandoned) as e:
                    progress.on_event(f"rung {level} failed, keeping the one pass's order: "
                                      f"{str(e)[:200]}")
                    return None
                order = sorted(range(len(rung)), key=lambda k: (timings[k].median_ms,
                                                                rung[k].index))
                rung = [rung[k] for k in order]
            out[device] = rung[:keep]
        return out

    def _retime_finalists(self, driver: Driver, tally: Tally, progress: ProgressReporter,
                          should_stop: Callable[[], bool], backend: str,
                          promoted: dict[str, list[Best]] | None = None
                          ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], bool]:
        """One pass picks winners by noise as much as by speed: re-time the fastest few
        side by side and let that decide the best: on each device type the records name,
        on a device of that type. Updates tally's bests. Returns the finalists, the torch
        baseline's timing on each device type where measured, and whether a stop cut the
        re-timing short. promoted: each device type's finalists, where halving's rungs
        chose them. On the interpreter, configs that differ only in launch options are one
        program: each is re-timed once, as its fastest one-pass config."""
        cut = False
        noise = _interpreted_options(self.spec, backend)
        finalists: list[dict[str, Any]] = []
        baseline: dict[str, dict[str, Any]] = {}
        winners: dict[str, Best] = {}
        for device in tally.devices:
            leaders = promoted[device] if promoted and device in promoted else \
                tally.leaders(LEADERS if noise else self.spec.run.finalists, device)
            if noise:
                leaders = _distinct_programs(leaders, noise)[:self.spec.run.finalists]
            if len(leaders) < 2:
                continue
            on = f" on {device}" if len(tally.devices) > 1 else ""
            progress.on_event(f"re-timing the {len(leaders)} fastest configs{on} side by side")
            try:
                retimed = driver.retime([b.config for b in leaders],
                                        self.spec.run.finalist_rounds, device)
            except (DriverFailed, RetimeAbandoned) as e:  # the sweep's best stands
                progress.on_event(f"re-timing failed, keeping the sweep's best{on}: "
                                  f"{str(e)[:200]}")
                cut = cut or should_stop()
                continue
            finalists += [
                {"index": b.index, "config": b.config, "device": device,
                 "sweep_latency_ms": b.latency_ms, "latency_ms": t.median_ms,
                 "latency_p20_ms": t.p20_ms, "latency_p80_ms": t.p80_ms}
                for b, t in zip(leaders, retimed.finalists)]
            if retimed.baseline is not None:
                b = retimed.baseline
                baseline[device] = {"latency_ms": b.median_ms, "latency_p20_ms": b.p20_ms,
                                    "latency_p80_ms": b.p80_ms, "of": retimed.baseline_of}
            leader, timing = min(zip(leaders, retimed.finalists),
                                 key=lambda p: (p[1].median_ms, p[0].index))
            winners[device] = Best(leader.index, leader.config, timing.median_ms, device)
        if winners:
            tally.set_best(winners)
        return finalists, baseline, cut


def _worker_settings(spec: Spec, backend: str) -> WorkerSettings:
    return WorkerSettings(
        backend=backend, kernel=spec.kernel, problem=dict(spec.problem),
        trial_timing=spec.timing.per_config(spec.run.finalists),
        finalist_timing=(spec.timing.warmup_ms, spec.timing.rep_ms),
        tolerance=(spec.validation.rtol, spec.validation.atol) if spec.validation else None,
        seed=spec.run.seed,
        simulate={k: v for k, v in vars(spec.simulate).items()
                  if k not in ("workers", "devices", "resources")},
        compile_timeout_s=spec.run.compile_limit_s,
        kernel_path=str(Path.cwd()),
        replay={"table": spec.replay.table, "time_scale": spec.replay.time_scale},
        run=spec.fingerprint, fixed=dict(spec.fixed))


def _failed(future: Future[Spec] | None) -> bool:
    return future is not None and future.done() and future.exception() is not None


def _say_if_slow(future: Future[Spec], after_s: float, say_it: Callable[[], None]) -> None:
    """say_it() once, if the future is still running after_s from now."""
    timer = threading.Timer(after_s, lambda: None if future.done() else say_it())
    timer.daemon = True
    timer.start()
    future.add_done_callback(lambda _: timer.cancel())


def _in_background(call: Callable[[], Spec]) -> Future[Spec]:
    """call() on a daemon thread: a run stopped meanwhile must not wait, at exit, for a
    kernel module's import to end."""
    future: Future[Spec] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as e:  # handed to whoever waits on the future
            future.set_exception(e)

    threading.Thread(target=run, name="kernel-import", daemon=True).start()
    return future


def _move_aside(run: RunDir) -> Path:
    """Move every file of the run in `run.path` (its lock aside, which this session holds)
    into a new sibling directory named for the moment; one cut short midway is moved back.
    run.json goes last, so that even a kill midway leaves the run's record where it was."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = run.path.with_name(f"{run.path.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = run.path.with_name(f"{run.path.name}.replaced-{stamp}-{n}")
    moved: list[str] = []
    try:
        aside.mkdir()
        names = sorted((p.name for p in run.path.iterdir() if p.name != LOCK_NAME),
                       key=lambda name: name == rundir.META)
        for name in names:
            os.rename(run.path / name, aside / name)
            moved.append(name)
    except BaseException as e:  # a failure or a Ctrl+C midway: the run goes back whole
        for name in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(aside / name, run.path / name)
        with contextlib.suppress(OSError):
            aside.rmdir()
        if isinstance(e, OSError):
            raise SpecError(f"--force: cannot move the run in {run.path} aside to {aside} "
                            f"({e.strerror or e}); it is where it was") from None
        raise
    return aside


def _make_dirs(path: Path) -> list[Path]:
    """mkdir -p, returning the directories it made, innermost first (to remove again if
    the run never starts). One made meanwhile by another process is not ours."""
    made: list[Path] = []
    try:
        for p in reversed([path, *path.parents]):
            try:
                p.mkdir()
                made.insert(0, p)
            except FileExistsError:
                continue
    except OSError:
        _remove_dirs(made)
        raise
    return made


def _lock(path: Path, command: str) -> RunDirLock:
    try:
        return RunDirLock.acquire(path, command)
    except OSError as e:  # read-only, or a filesystem without locks
        raise SpecError(f"{path}: cannot write to the run directory ({e.strerror or e})"
                        ) from None


def _give_back(lock: RunDirLock, created: list[Path]) -> None:
    """Unlock; directories this session made and used for nothing go away again."""
    lock.release(remove=True)
    _remove_dirs(created)


def _remove_dirs(dirs: list[Path]) -> None:
    for p in dirs:  # innermost first
        try:
            p.rmdir()
        except OSError:
            return  # not empty: something else lives there now


def _batch_size(spec: Spec, backend: str, placement: Placement) -> int:
    if backend in ("cuda", "replay"):
        # Enough configs per batch that the compile pool works ahead of the GPU.
        return 2 * max(1, placement.compile_workers)
    if backend != "simulate":
        return 1  # interpreted trials take far longer than a Ray round trip
    per_trial_s = max(spec.simulate.trial_ms, 0.05) / 1e3
    return int(min(1024, max(1, TARGET_BATCH_S / per_trial_s)))


def _candidates(spec: Spec, backend: str) -> list[cache.CacheEntry]:
    """Cache entries that this very sweep (its fingerprint) completed on some device.
    Simulate and replay runs measure this tool, not a kernel: nothing answers them."""
    if backend not in ("interpret", "cuda"):
        return []
    return [e for e in cache.lookup(spec.kernel, spec.kernel_source, spec.problem,
                                    spec.fixed_as_written)
            if e.backend == backend and not e.partial and spec.fingerprint in e.runs
            and _fits(spec, e)]


def _fits(spec: Spec, entry: cache.CacheEntry) -> bool:
    """Whether the entry's config sets only parameters this sweep tunes: one that names
    others (a hand edit, another sweep that tuned more) cannot be its answer, though it
    may lie outside the space's values (the best any sweep of that key found)."""
    return set(entry.config) <= set(spec.space)


def _print_errors(out: Console, records: pa.Table, top: int = 5) -> None:
    """Why nothing worked: the commonest errors, grouped, so the user need not open the
    table to find out."""
    groups = common_errors(records, top)
    say(out, "  no config succeeded; the commonest errors:")
    for group in groups:
        say(out, f"    {group.count:>6} × {group.status}: {group.example} (e.g. #{group.index})")


def _print_cached(out: Console, spec: Spec, space: Space,
                  hits: list[cache.CacheEntry]) -> None:
    for e in hits:
        say(out, f"sweep {spec.name}: cached — this sweep of {e.kernel} completed on "
                 f"{printable(e.device)} before; the best any sweep found there is from "
                 f"{printable(e.run_dir, 4096)} "
                 f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(e.written_at))})")
        outside = "" if indices_of(space, [e.config]) else " (outside this sweep's space)"
        config = json.dumps(dict(e.config), sort_keys=True)  # escapes control characters
        say(out, f"  best: {config} "
                 f"{e.latency_ms:.4g} ms{outside}")
    say(out, "  nothing was run; pass --force to tune again")


def _interpreted_options(spec: Spec, backend: str) -> list[str]:
    """Launch options the space varies, on the interpreter, which ignores them."""
    if backend != "interpret":
        return []
    return [k for k in LAUNCH_OPTIONS if len(spec.space.get(k, ())) > 1]


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


def _note_interpreted_options(spec: Spec, backend: str, err: Console) -> None:
    varied = _interpreted_options(spec, backend)
    if varied:
        say(err, f"note: Triton's interpreter ignores {', '.join(varied)}: their values "
                 "take the same time here, so the best-config cache leaves them out")
