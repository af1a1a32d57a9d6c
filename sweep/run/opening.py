"""Opening a run directory for a session: a new run's checks before anything is written, a
resumed run's checks against its own record, and the lock held from before the first read.

A new run is checked from its file alone here, and hands on an importer of its kernel,
which the session begins on a thread while Ray starts; a resumed run's spec, checked first
against the run's record of it, is loaded with its kernel.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from storage.lock import LOCK_NAME, RunDirLock
from storage.readback import ReadBackError, open_regular, read_small
from storage.snapshot import SnapshotError, read_snapshot
from sweep.results.summary import resume_command
from sweep.run import rundir
from sweep.run.rundir import RunDir
from sweep.spec import Spec, SpecError, load_spec, read_spec_text
from sweep.spec.space import Space
from sweep_kernels import BUILTIN

IMPORT_NOTICE_S = 2.0  # a kernel import that takes longer is said while it runs


@dataclass
class Opened:
    """A run directory locked for one session, and what opening it read."""

    spec: Spec
    space: Space
    path: Path
    lock: RunDirLock
    meta: dict[str, Any] | None = None  # the run's run.json when resuming
    complete: bool = False  # the snapshot says the run is complete
    earlier: list[list[float]] = field(default_factory=list)  # see Snapshot.sessions
    created: list[Path] = field(default_factory=list)  # directories this session made
    kernel: KernelImport | None = None  # a new run's


def checked_path(path: Path, what: str) -> Path:
    """Paths end up in JSON, Parquet metadata and messages: they must be text."""
    try:
        str(path).encode()
    except UnicodeEncodeError:
        raise SpecError(f"{what}: {str(path)!a} is not valid UTF-8; use another name") from None
    return path


def run_path(path: Path, what: str) -> Path:
    """A run directory's path, absolute: Ray's start changes the working directory for a
    moment (see sweep/engines/ray/cluster.py) while another thread may be reading the run
    directory."""
    return checked_path(path, what).absolute()


def open_new(spec_path: Path, out: Path | None, backend: str | None, command: str,
             replace_run: bool = False,
             say_line: Callable[[str], None] = lambda line: None) -> Opened:
    """replace_run (--force): a run already in `out` is moved aside first, never deleted
    (after a kernel edit, resume refuses it and this is the way on)."""
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
        _check_room_for_a_run(RunDir(path), replace_run, say_line, spec.as_yaml())
    except BaseException:
        give_back(lock, created)
        raise
    # Read from this directory, not the current one: connecting to Ray changes that for a
    # moment (see sweep/engines/ray/cluster.py) while this thread may be reading.
    here = Path.cwd()

    def importer() -> Future[Spec]:
        full_spec = _in_background(lambda: load_spec(spec_path, backend=backend, cwd=here,
                                                     text=text))
        if spec.kernel not in BUILTIN:  # a package's import can take long: say so
            module = spec.kernel.partition(":")[0]
            _say_if_slow(full_spec, IMPORT_NOTICE_S, lambda: say_line(
                f"importing {module} (the spec's kernel) to check the spec against it"))
        return full_spec

    return Opened(spec, space, path, lock, created=created, kernel=KernelImport(importer))


class KernelImport:
    """A new run's spec with its kernel imported, on a thread: torch and the kernel module
    take seconds to import, so that happens while the engine starts. Begun once, when
    first asked for."""

    def __init__(self, begin: Callable[[], Future[Spec]]) -> None:
        self._begin = begin
        self._future: Future[Spec] | None = None

    def begin(self) -> None:
        if self._future is None:
            self._future = self._begin()

    def result(self) -> Spec:
        """The spec checked against its kernel (its mistake raised, as SpecError)."""
        self.begin()
        assert self._future is not None
        return self._future.result()

    def failed(self) -> bool:
        """Whether the import has ended with the spec's mistake already."""
        return self._future is not None and self._future.done() and \
            self._future.exception() is not None

    def raise_if_failed(self) -> None:
        if self.failed():
            self.result()


def _check_room_for_a_run(run: RunDir, replace_run: bool,
                          say_line: Callable[[str], None], spec_yaml: str) -> None:
    """spec_yaml: the spec.yaml this run writes. One standing there alone, byte for byte,
    is what a start of the same run killed before its run.json left: taken, not refused."""
    path = run.path
    if run.meta.exists() and replace_run:
        aside = _move_aside(run)
        say_line(f"{path} held a run: moved it to {aside}, whole; starting anew")
    if run.meta.exists():
        raise SpecError(f"{path}: already holds a run; continue it with: "
                        f"{resume_command(path)}, or start anew there with --force "
                        "(which moves it aside)")
    if run.holds_run() and not _this_start_cut_short(run, spec_yaml):
        raise SpecError(f"{path}: holds a run's files but no {rundir.META} (a start "
                        "cut short, or files of something else); choose another "
                        "--out, or remove them")
    others = sorted(p.name for p in path.iterdir() if not _the_sweeps(run, p.name))
    if others:  # the user's own files: a run written among them, a later --force takes them
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3
                                         else "")
        raise SpecError(f"--out {path}: not a run directory and not empty (it holds "
                        f"{shown}); choose a new or empty folder for the run")


def _this_start_cut_short(run: RunDir, spec_yaml: str) -> bool:
    if any(p.exists() for p in (run.meta, run.journal, run.trials)):
        return False
    try:
        return read_small(run.spec, len(spec_yaml.encode())) == spec_yaml.encode()
    except (OSError, ReadBackError):
        return False


def _the_sweeps(run: RunDir, name: str) -> bool:
    """A file a start cut short may leave (a log, an atomic write's temporary file)."""
    own = {p.name for p in (run.meta, run.spec, run.journal, run.trials, run.attempts,
                            run.best, run.snapshot, run.ray_log, run.workers_log)}
    temporary = name.startswith(".") and name.endswith(".tmp") and \
        name[1:].rpartition(".")[0].rpartition(".")[0] in own  # .NAME.XXXX.tmp
    return name == LOCK_NAME or name in own or temporary


def open_existing(path: Path, command: str,
                  say_line: Callable[[str], None] = lambda line: None) -> Opened:
    """A run directory to resume, checked against its own record of the run."""
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
        return _reopen_locked(run, lock, say_line)
    except BaseException:
        lock.release(remove=True)
        raise


def declared_spec(run: RunDir, declared: str, then: str) -> tuple[Spec, str]:
    """The run's spec.yaml as the file alone decides it (no kernel imported) and its text,
    checked against the run's record of it (run.json's declared fingerprint). then: what
    the refusal tells the user to do."""
    try:  # the run's own copy: a FIFO or a device there is damage, never a hang
        os.close(open_regular(run.spec))
    except ReadBackError as e:
        raise SpecError(str(e)) from None
    except FileNotFoundError:
        pass  # read_spec_text says so
    text = read_spec_text(run.spec)
    spec = load_spec(run.spec, import_kernel=False, text=text)
    if spec.declared_fingerprint != declared:
        raise SpecError(f"{run.spec}: changed since this run started; {then}")
    return spec, text


def _reopen_locked(run: RunDir, lock: RunDirLock,
                   say_line: Callable[[str], None]) -> Opened:
    path = run.path
    meta = rundir.read_meta(run)
    # The spec names a module to import, which runs its code: check the spec against the
    # run's record of it first, so a spec.yaml edited since names nothing new.
    _, text = declared_spec(run, meta["declared"], "start a new run with sweep run")
    # The name may come from the spec file's name, which is spec.yaml here.
    spec = replace(load_spec(run.spec, text=text), name=meta["name"])
    if spec.fingerprint != meta["fingerprint"]:
        raise SpecError(f"{path}: {_what_changed(run, meta['fingerprint'], spec)} since this "
                        f"run started (fingerprint {meta['fingerprint']}, now "
                        f"{spec.fingerprint}); `sweep run SPEC --out {path} --force` starts "
                        "anew there (moving this run aside), or sweep run elsewhere")
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
            say_line(f"warning: {e}; rebuilding the run from the journal")
    return Opened(spec, space, path, lock, meta, complete, earlier)


# What each part of a spec's identity is, to the user: the spec file itself is unchanged
# (its declared fingerprint matched), so a difference comes from the kernel's side.
_PARTS = {"kernel_source": "the kernel's source", "problem": "the problem (with the kernel's "
          "defaults)", "problems": "the problems (with the kernel's defaults)",
          "fixed": "the fixed values (with the kernel's own)"}


def _what_changed(run: RunDir, fingerprint: str, spec: Spec) -> str:
    """Which of the kernel's source, the problem or the rest changed: the run's trial
    table records the identity its fingerprint covers (when it is this run's)."""
    import json

    from storage.table import read_parquet_schema

    unknown = "the spec, kernel source or problem changed"
    try:
        info = read_parquet_schema(run.trials).metadata or {}
        if info.get(b"fingerprint") != fingerprint.encode():
            return unknown
        then = json.loads(info[b"spec"])
    except Exception:  # missing, damaged or another run's table: say what it may be
        return unknown
    now = json.loads(json.dumps(spec.identity()))  # as the table holds it: lists, not tuples
    beside = {"name", "run", "work"}  # the table's, beside the identity
    changed = {_PARTS.get(key, "the spec") for key in (now.keys() | then.keys()) - beside
               if now.get(key) != then.get(key)}
    said = [part for part in (*_PARTS.values(), "the spec") if part in changed]
    if not said:
        return unknown
    return (", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]) + \
        (" have" if len(said) > 1 else " has") + " changed"


def give_back(lock: RunDirLock, created: list[Path]) -> None:
    """Unlock; directories this session made and used for nothing go away again."""
    lock.release(remove=True)
    _remove_dirs(created)


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


def _remove_dirs(dirs: list[Path]) -> None:
    for p in dirs:  # innermost first
        try:
            p.rmdir()
        except OSError:
            return  # not empty: something else lives there now
