"""One invocation of `sweep run` or `sweep resume`, as a short sequence of named steps:
open the run directory (sweep/run/opening.py), ask the cache (cache_policy.py), connect
the engine it is handed, drive (drive.py: assemble the driver, run the trials, finish,
write the run's files) and say how it ended (conclusion.py).

Everything that can be refused (spec, run directory, fingerprint) is checked before Ray
starts, with the run directory locked (storage/lock.py) from before it is first read to
the end; a signal at any point from start-up to the final write ends in a clean stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from rich.console import Console

from actors import spares
from actors.backends import may_interpret, resolve
from storage import cache
from sweep import EXIT_FAILED, EXIT_NONE_WORKED, EXIT_OK
from sweep.console import Output, say
from sweep.engines import machine
from sweep.engines.prestart import PRESTART_ENV, Prestart
from sweep.engines.runtime import ConnectAbandoned, Engine, Placement
from sweep.results.summary import (
    print_errors,
    resume_command,
)
from sweep.run import cache_policy, opening, repair, rundir
from sweep.run.assembly import (
    Start,
    interpreted_options,
    retried,
    worker_settings,
)
from sweep.run.budget import TimeBudget
from sweep.run.cache_policy import CacheAnswers
from sweep.run.conclusion import Concluding, conclude
from sweep.run.drive import RunContext, drive
from sweep.run.opening import Opened
from sweep.run.request import Request, SessionEnd
from sweep.run.rundir import Loaded, RunDir
from sweep.run.stop import StopController
from sweep.search.plan import plan_search
from sweep.search.scheduling import AdaptiveLimit, compile_order
from sweep.search.strategies import SearchPlan, most
from sweep.spec import Spec, SpecError, check_dtype_for_backend
from sweep.spec.space import Space


@dataclass
class Session:
    """One command's session over a run directory: what opening it read, and what this
    session decides as it runs (its timeline, early start, order, ending)."""

    opened: Opened  # the run directory, locked, and what opening it read
    spec: Spec  # opened's; a new run's with its kernel's facts, once the kernel is imported
    # `sweep resume --retry`: recorded statuses whose configs run again (a new attempt,
    # which supersedes the record), compiles limited by run.trial_timeout_s alone
    retry: frozenset[str] = frozenset()
    # What a search decided when the run was created (see rundir.create); from run.json
    # on resume.
    meta_search: SearchPlan | None = None
    timeline: dict[str, float] = field(default_factory=dict)  # see Snapshot.timeline
    prestart: Prestart | None = None  # what a local GPU run began before Ray was up
    order: list[int] | None = None  # every config in compile order, once computed
    ending: SessionEnd | None = None  # set once execute() has decided
    answers: CacheAnswers = field(default_factory=CacheAnswers)
    io: Output = field(default_factory=Output.silent)  # the command's, once execute() runs

    @property
    def space(self) -> Space:
        return self.opened.space

    @property
    def path(self) -> Path:
        return self.opened.path

    @property
    def meta(self) -> dict[str, Any] | None:
        """The run's run.json when resuming."""
        return self.opened.meta

    @classmethod
    def start(cls, spec_path: Path, out: Path | None, backend: str | None,
              command: str, replace_run: bool = False,
              say_line: Callable[[str], None] = lambda line: None) -> Session:
        """replace_run (--force): a run already in `out` is moved aside first, never
        deleted (after a kernel edit, resume refuses it and this is the way on)."""
        opened = opening.open_new(spec_path, out, backend, command, replace_run, say_line)
        return cls(opened, opened.spec)

    @classmethod
    def reopen(cls, path: Path, command: str,
               say_line: Callable[[str], None] = lambda line: None,
               retry: frozenset[str] = frozenset()) -> Session:
        """retry: `sweep resume --retry`'s statuses."""
        opened = opening.open_existing(path, command, say_line)
        assert opened.meta is not None
        return cls(opened, opened.spec, retry=retry, meta_search=opened.meta.get("search"))

    def execute(self, request: Request, stop: StopController, io: Output, engine: Engine,
                started: float | None = None) -> int:
        """engine: where the workers run (sweep/engines/selection.py chooses one); started:
        when the command began (time.monotonic()), for the summary's time and the time
        budget."""
        try:
            self.io = io
            return self._execute(request, stop, engine,
                                 started if started is not None else time.monotonic())
        except OSError as e:
            if not rundir.storage_error(e, self.path):
                raise
            then = (f"every trial acknowledged is in its journal. Make room, then: "
                    f"{resume_command(self.path)}") if RunDir(self.path).meta.exists() \
                else "nothing was kept. Make room and run it again"
            io.note(f"error: {self.path}: {e.strerror or e} while writing the run "
                    f"directory; {then}")
            return EXIT_FAILED
        finally:
            self.release()

    def release(self) -> None:
        """The run directory is given back (unlocked; directories made for a run that
        never started removed again)."""
        made = [] if RunDir(self.path).meta.exists() else self.opened.created
        opening.give_back(self.opened.lock, made)

    def _execute(self, request: Request, stop: StopController, engine: Engine,
                 t0: float) -> int:
        self.timeline["session_start"] = time.time()
        run = RunDir(self.path)
        loaded = None
        if self.meta and self.opened.complete:
            loaded = self._load(run)
            code = self._nothing_to_run(run, loaded)
            if code is not None:
                return code
        # Reading a big journal and starting Ray both take seconds: do them side by side
        # (Ray must start on this, the main thread: its processes die with the thread).
        if not self.meta and not request.force and self._answered(self._answered_early(engine)):
            return EXIT_OK
        if self.opened.kernel is not None:
            self.opened.kernel.begin()
        try:
            self._spec_refused()  # the kernel's import already found a mistake
            if not self.meta and engine.on_this_machine() and \
                    os.environ.get(PRESTART_ENV) != "0":
                self.prestart = self._prestart(engine)
            spares.end()  # those the early start did not take: not held through the run
            try:
                loaded = self._connect(run, engine, loaded, stop)
            except ConnectAbandoned:
                return stop.exit_code
            backend, placement = self._resolve(engine)
            code = self._before_the_run(engine, backend, placement, request, stop, t0)
            if code is not None:
                return code
            if not self.meta:
                self._create(run, backend, placement)
            context = RunContext(
                run=run, spec=self.spec, space=self.space, engine=engine, backend=backend,
                placement=placement, io=self.io, timeline=self.timeline,
                earlier=self.opened.earlier,
                launchers=self.prestart.launchers if self.prestart else {},
                on_compilers_up=self._early_compiles_end)
            drove = drive(context, Start(loaded, self.retry, self.meta_search,
                                         request.max_trials, self._full_order),
                          request, stop, t0)
            self.ending = SessionEnd(drove.state)
            return conclude(Concluding(self.spec, self.space, self.path, run, backend,
                                       self.retry, self.io, request, stop, t0), drove)
        finally:
            if self.prestart:  # what its launchers printed goes with the run, if one began
                self.prestart.close(run.workers_log if run.meta.exists() else None)
            engine.close()

    def _load(self, run: RunDir) -> Loaded:
        loaded = rundir.load_records(run, self.spec, self.space)
        if loaded.recovered.num_rows:
            self.io.note(repair.rejournal(run, self.spec, loaded))
        return loaded

    def _nothing_to_run(self, run: RunDir, loaded: Loaded) -> int | None:
        """A complete run resumed without a retry to run: its exit code (None: go on)."""
        if loaded.records.num_rows != len(self.space) or retried(loaded, self.retry):
            return None
        nothing = f"no config recorded {' or '.join(sorted(self.retry))}; " \
            if self.retry else ""
        self.io.result(f"{self.path}: already complete ({len(self.space)} trials); "
                       + nothing + repair.repair_complete(run, self.spec, self.space, loaded))
        self.ending = SessionEnd("complete")
        if not pc.any(pc.equal(loaded.records.column("status"), "ok")).as_py():
            print_errors(self.io.out, loaded.records)
            return EXIT_NONE_WORKED
        return EXIT_OK

    def _answered(self, hits: list[cache.CacheEntry]) -> bool:
        if hits:
            cache_policy.print_cached(self.io.out, self.spec, self.space, hits)
            self.ending = SessionEnd("cached", cached=hits)
        return bool(hits)

    def _connect(self, run: RunDir, engine: Engine, loaded: Loaded | None,
                 stop: StopController) -> Loaded | None:
        """The engine connects while a resumed run's journal is read and a new run's
        kernel imported; returns the records read. ConnectAbandoned: said, and raised."""
        with ThreadPoolExecutor(1) as pool:
            loading = pool.submit(rundir.load_records, run, self.spec, self.space) \
                if self.meta and loaded is None else None
            try:
                engine.connect(lambda: stop.requested or bool(self.opened.kernel and
                                                              self.opened.kernel.failed()),
                               self.io.note)
            except ConnectAbandoned as e:
                self._spec_refused()  # a join given up for the spec's mistake
                self.io.note(f"{e}; " + ("the run is unchanged" if self.meta
                                         else "nothing was written"))
                raise
            finally:
                stop.install()  # Ray may have replaced our handlers
            engine.divert_reports(run.ray_log if engine.name == "ray" else run.workers_log)
            self.timeline[f"{engine.name}_ready"] = time.time()
            if loading is not None:
                loaded = loading.result()
                if loaded.recovered.num_rows:
                    self.io.note(repair.rejournal(run, self.spec, loaded))
            if self.opened.kernel is not None:
                self.spec = self.opened.kernel.result()
                self.timeline["kernel_imported"] = time.time()
        return loaded

    def _resolve(self, engine: Engine) -> tuple[str, Placement]:
        """The backend the engine resolves to, and where its workers go."""
        backend = engine.resolve_backend(self.spec)
        if self.prestart and backend != self.prestart.backend:  # Ray found no GPU
            self.prestart.close()
            self.prestart = None
        for i, problem in enumerate(self.spec.each_problem()):
            check_dtype_for_backend(self.spec.path, problem, backend,
                                    f"problems[{i}]" if self.spec.problems else "problem")
        placement = engine.placement(self.spec, backend)  # may refuse the spec
        if self.meta and backend != self.meta["backend"]:
            raise SpecError(f"{self.path}: the run used backend {self.meta['backend']}, "
                            f"but this cluster resolves to {backend}; pass the same kind "
                            "of cluster")
        return backend, placement

    def _before_the_run(self, engine: Engine, backend: str, placement: Placement,
                        request: Request, stop: StopController, t0: float) -> int | None:
        """What ends a session before its run begins (the cache's answer, a stop, a spent
        time budget): its exit code; None: the run goes on."""
        if not self.meta and not request.force and not stop.requested and self._answered(
                self.answers.after_connect(self.spec, engine, backend, placement,
                                                lambda: stop.requested)):
            return EXIT_OK
        if stop.requested and not self.meta:
            self.io.note("stopped before the run started; nothing was written")
            return stop.exit_code
        if not self.meta and TimeBudget(t0, request.time_budget_s).spent():
            self.io.note(f"the time budget of {request.time_budget_s:g} s was spent before "
                         "the run started; nothing was written")
            return EXIT_OK
        cache_policy.say_gone(self.io.err, self.answers.gone)
        return None

    def _create(self, run: RunDir, backend: str, placement: Placement) -> None:
        _note_interpreted_options(self.spec, backend, self.io.err)
        self.meta_search, line = plan_search(self.spec, self.space, backend, placement.workers,
                                             placement.compile_workers)
        if line:
            self.io.note(line)
        rundir.create(run, self.spec, len(self.space), backend, search=self.meta_search)

    def _prestart(self, engine: Engine) -> Prestart | None:
        """Work begun before the kernel is imported here and the engine is up: a GPU's
        launchers and early compiles (where every config runs: a search's first configs
        depend on the cluster's size), or locally a fork server for the pools; under the interpreter
        on the local runtime, whose workers adopt them, each worker's launcher (which
        imports torch and the kernel)."""
        backend = self.spec.run.backend
        if resolve(backend, len(machine.visible_gpus())) == "cuda":
            every = most(self.spec.search, self.space.sizes) is None
            return Prestart.begin(worker_settings(self.spec, "cuda"), ((
                i, self.space.config(i)) for i in self._full_order()) if every else (),
                adopted_pools=engine.name == "local")
        if may_interpret(backend) and engine.name == "local" and \
                machine.local_devices(backend) == ["cpu-interpreter"]:
            workers = engine.placement(self.spec, "interpret").workers
            return Prestart.begin_interpret(worker_settings(self.spec, "interpret"), workers)
        return None

    def _early_compiles_end(self, limit: AdaptiveLimit | None) -> None:
        """The workers' pools are up: the early pool stops, and what it compiled while Ray
        started teaches the compile limit (the workers find those binaries in Triton's
        cache, in a few ms that say nothing of how long this kernel's compiles take)."""
        if self.prestart is not None:
            took = self.prestart.stop_compiling()
            if limit is not None:
                limit.observe_compiles(took)

    def _answered_early(self, engine: Engine) -> list[cache.CacheEntry]:
        """The cache's answer before the kernel is imported and the engine starts (see
        CacheAnswers.before_start); a spec it imported to answer becomes the session's."""
        if self.opened.kernel is None:
            return []
        hits, full = self.answers.before_start(self.spec, engine, self.opened.kernel.result)
        if full is not None:
            self.spec = full
        return hits

    def _spec_refused(self) -> None:
        """Raise the spec's mistake that importing the kernel found, if it has."""
        if self.opened.kernel is not None:
            self.opened.kernel.raise_if_failed()

    def _full_order(self) -> list[int]:
        """Every config in the order to hand out (a new run's), computed once: before Ray
        starts for the early compiles, then for the driver's queue."""
        if self.order is None:
            self.order = compile_order(self.space, range(len(self.space)))
        return self.order


def _note_interpreted_options(spec: Spec, backend: str, err: Console) -> None:
    varied = interpreted_options(spec, backend)
    if varied:
        say(err, f"note: Triton's interpreter ignores {', '.join(varied)}: their values "
                 "take the same time here, so the best-config cache leaves them out")
