"""The Python API: `run` and `resume` a sweep from Python (a notebook, a script) and get a
`SweepResult`; `load` one from a run directory.

The CLI goes through the same `invoke`, so a call does what the command does, with two
differences a library owes its caller: signal handlers are installed only for the call
(and the caller's given back after it), and a stop by Ctrl+C ends in KeyboardInterrupt
once the run is written (snapshot, resumable), where the command would exit 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.console import Output
from sweep.observers import TrialCallback, TrialsJsonl
from sweep.result import BestConfig, ProblemBest, SweepResult
from sweep.run.stop import StopController
from sweep.spec import BACKEND_CHOICES, RUNTIMES, SpecError
from sweep.spec.constraints import clip_repr

if TYPE_CHECKING:
    from storage.best_file import Choice
    from storage.records import Best
    from storage.snapshot import Snapshot
    from sweep.run.request import Request
    from sweep.run.session import Session

SpecLike = str | Path | Mapping[str, Any]


def run(spec: SpecLike, *, out: str | Path | None = None, backend: str | None = None,
        address: str | None = None, runtime: str | None = None,
        max_trials: int | None = None,
        time_budget_s: float | None = None, cache_partial: bool = False, force: bool = False,
        on_trial: Callable[[dict[str, Any]], object] | None = None,
        trials_jsonl: str | Path | None = None, quiet: bool = False,
        stop: threading.Event | None = None) -> SweepResult:
    """Run a sweep: `spec` is a spec file's path or the spec itself as a mapping (its
    relative paths are then from the current directory). The options are the CLI's
    (`sweep run --help`); on_trial(record) is called on this thread once per finished
    trial, in completion order, with the trial's row as JSON-compatible values. quiet:
    print nothing (progress and summary go to stderr and stdout otherwise). stop: once
    set (from any thread), the sweep stops as on Ctrl+C, and the call returns its
    (resumable) result: how a call on a thread other than the main one, which gets no
    signals, is stopped.

    Raises SpecError (a ValueError) for bad input, with the CLI's one-line message, and
    KeyboardInterrupt after a Ctrl+C has stopped the run cleanly (resume it with
    `resume(run_dir)`)."""
    if not isinstance(spec, Mapping):
        _path(spec, "spec", "a spec file's path (a str or os.PathLike) or a mapping",
              optional=False)
    out_dir = _path(None if out == "" else out, "out")  # "": not given, as before
    if backend is not None and backend not in BACKEND_CHOICES:
        raise SpecError(f"backend: expected one of {', '.join(BACKEND_CHOICES)} or None, "
                        f"got {clip_repr(backend)}")
    _flag(force, "force")
    _common(address, runtime, max_trials, time_budget_s, cache_partial, trials_jsonl, quiet,
            stop)
    with _spec_file(spec) as (path, shown):
        return _call(lambda request, stop, io, t0: invoke(
            "run", path, request, stop, io, t0, out_dir=out_dir,
            backend=backend, label="sweep.api.run()", callers_ray=True),
            _request(address, runtime, max_trials, time_budget_s, cache_partial, force,
                     on_trial, trials_jsonl),
            quiet, stop, rename=(str(path), shown) if shown else None)


def resume(run_dir: str | Path, *, address: str | None = None, runtime: str | None = None,
           max_trials: int | None = None, time_budget_s: float | None = None,
           cache_partial: bool = False, retry: str | Sequence[str] = (),
           on_trial: Callable[[dict[str, Any]], object] | None = None,
           trials_jsonl: str | Path | None = None, quiet: bool = False,
           stop: threading.Event | None = None) -> SweepResult:
    """Continue a stopped run in place (see run()); retry: recorded statuses whose configs
    run again, as `sweep resume --retry` ("timeout,crashed" or ["timeout", "crashed"])."""
    from sweep.run.request import retry_statuses

    path = _required_path(run_dir, "run_dir")
    _common(address, runtime, max_trials, time_budget_s, cache_partial, trials_jsonl, quiet,
            stop)
    if not isinstance(retry, str) and not (
            isinstance(retry, (list, tuple, set, frozenset))
            and all(isinstance(s, str) for s in retry)):
        raise SpecError("retry: expected statuses as \"timeout,crashed\" or a list of "
                        f"strings, got {clip_repr(retry)}")
    text = retry if isinstance(retry, str) else ",".join(sorted(retry))
    statuses = retry_statuses(text, "retry") if text else frozenset()
    return _call(lambda request, stop, io, t0: invoke(
        "resume", path, request, stop, io, t0, retry=statuses,
        label="sweep.api.resume()", callers_ray=True),
        _request(address, runtime, max_trials, time_budget_s, cache_partial, False,
                 on_trial, trials_jsonl), quiet, stop)


def load(run_dir: str | Path) -> SweepResult:
    """The result of a run directory as it stands (a finished, stopped or running run)."""
    from sweep.run.rundir import RunDir

    path = _required_path(run_dir, "run_dir")
    if not RunDir(path).meta.exists():
        raise SpecError(f"{path}: not a sweep run directory (no run.json)")
    return _from_run_dir(path, None, None, 0.0)


def invoke(command: str, target: Path, request: Request, stop: StopController, io: Output,
           started: float, *, out_dir: Path | None = None,
           backend: str | None = None, retry: frozenset[str] = frozenset(),
           label: str = "", shut_down: bool = True,
           callers_ray: bool = False) -> tuple[int, Session]:
    """`sweep run` (target: the spec) or `sweep resume` (target: the run directory), as
    the CLI and the API both do it. Returns the exit code and the session. shut_down:
    whether a Ray this call connects is shut down at its end (the CLI's process ends
    instead, without waiting on it). callers_ray: a Ray the caller connected counts as
    naming a cluster (the Python API's calls)."""
    from sweep.engines import selection as engines
    from sweep.run.session import Session

    session = (Session.start(target, out_dir, backend, label or command,
                             replace_run=request.force, say_line=io.note)
               if command == "run" else
               Session.reopen(target, label or command, io.note, retry=retry))
    try:
        engine = engines.choose(request.runtime, session.spec.run.runtime, request.address,
                                shut_down, callers_ray)
    except BaseException:
        session.release()
        raise
    return session.execute(request, stop, io, engine, started=started), session


def observers(on_trial: Callable[[dict[str, Any]], object] | None,
              trials_jsonl: str | Path | None,
              report: Callable[[str], None] | None = None, jsonl_name: str = "trials_jsonl"
              ) -> list[TrialCallback | TrialsJsonl]:
    """The observers a call asks for (see sweep/observers.py); close() each after the call.
    report: how an observer's failure is told (default: a warning); jsonl_name: what the
    caller calls trials_jsonl, for an error."""
    found: list[TrialCallback | TrialsJsonl] = []
    kwargs = {"report": report} if report else {}
    if on_trial is not None:
        if not callable(on_trial):
            raise SpecError(f"on_trial: expected a callable or None, "
                            f"got {clip_repr(on_trial)}")
        found.append(TrialCallback(on_trial, **kwargs))
    if trials_jsonl is not None:
        try:
            found.append(TrialsJsonl(Path(trials_jsonl), **kwargs))
        except OSError as e:
            raise SpecError(f"{jsonl_name}: cannot write {trials_jsonl} "
                            f"({e.strerror or e})") from None
    return found


def _path(value: object, name: str, what: str = "a path (a str or os.PathLike)",
          optional: bool = True) -> Path | None:
    """An option that names a file or directory, as a Path (None: not given)."""
    if value is None and optional:
        return None
    if isinstance(value, str) or (isinstance(value, os.PathLike)
                                  and isinstance(os.fspath(value), str)):
        return Path(value)
    raise SpecError(f"{name}: expected {what}{' or None' if optional else ''}, "
                    f"got {clip_repr(value)}")


def _required_path(value: object, name: str) -> Path:
    path = _path(value, name, optional=False)
    assert path is not None
    return path


def _flag(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise SpecError(f"{name}: expected True or False, got {clip_repr(value)}")


def _common(address: object, runtime: object, max_trials: object, time_budget_s: object,
            cache_partial: object, trials_jsonl: object, quiet: object,
            stop: object) -> None:
    """The options run() and resume() share, checked before anything is opened or
    started (on_trial is checked with the observers, limits in check_limits)."""
    if address is not None and not isinstance(address, str):
        raise SpecError(f"address: expected a Ray address (a str) or None, "
                        f"got {clip_repr(address)}")
    if runtime is not None and runtime not in RUNTIMES:
        raise SpecError(f"runtime: expected one of {', '.join(RUNTIMES)} or None, "
                        f"got {clip_repr(runtime)}")
    check_limits(max_trials, time_budget_s,  # type: ignore[arg-type]
                 ("max_trials", "time_budget_s"))
    _flag(cache_partial, "cache_partial")
    _path(trials_jsonl, "trials_jsonl")
    _flag(quiet, "quiet")
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise SpecError(f"stop: expected a threading.Event or None, got {clip_repr(stop)}")


def _request(address: str | None, runtime: str | None, max_trials: int | None,
             time_budget_s: float | None,
             cache_partial: bool, force: bool,
             on_trial: Callable[[dict[str, Any]], object] | None,
             trials_jsonl: str | Path | None) -> Request:
    from sweep.run.request import Request

    check_limits(max_trials, time_budget_s, ("max_trials", "time_budget_s"))
    return Request(address=address, runtime=runtime, max_trials=max_trials,
                   time_budget_s=time_budget_s,
                   cache_partial=cache_partial, force=force,
                   observers=tuple(observers(on_trial, trials_jsonl)))


def check_limits(max_trials: int | None, time_budget_s: float | None,
                 names: tuple[str, str] = ("--max-trials", "--time-budget")) -> None:
    """names: what the caller calls them (the CLI's options, the API's keywords)."""
    import math

    if max_trials is not None and (isinstance(max_trials, bool) or
                                   not isinstance(max_trials, int) or max_trials < 1):
        raise SpecError(f"{names[0]}: expected an integer >= 1, got {max_trials!r}")
    if time_budget_s is not None and (
            isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float))
            or not math.isfinite(time_budget_s) or time_budget_s <= 0):
        raise SpecError(f"{names[1]}: expected a finite number of seconds > 0, "
                        f"got {time_budget_s!r}")


Invoke = Callable[["Request", StopController, Output, float], "tuple[int, Session]"]


def _call(call: Invoke, request: Request, quiet: bool, asked: threading.Event | None,
          rename: tuple[str, str] | None = None) -> SweepResult:
    started = time.monotonic()
    stop = StopController(exit_at_once=False,
                          asked=asked.is_set if asked is not None else lambda: False)
    stop.install()
    try:  # on Ray, with the process's other calls (see sweep/engines/ray/engine.py)
        code, session = call(request, stop, Output.standard(quiet), started)
    except SpecError as e:
        if rename is None:
            raise
        raise SpecError(str(e).replace(*rename)) from None
    finally:
        stop.restore()
        for observer in request.observers:
            if isinstance(observer, TrialsJsonl):
                observer.close(lambda: stop.requested)
    result = _result(session, code, time.monotonic() - started)
    if result.complete:  # the signal came as the run ended: it changes nothing
        return result
    if stop.signum == signal.SIGINT:
        raise KeyboardInterrupt(
            f"sweep stopped; resume with sweep.api.resume({str(result.run_dir)!r})"
            if result.run_dir is not None else "sweep stopped before the run started; "
                                               "nothing was written")
    if stop.signum is not None:
        # The caller's own disposition of SIGTERM decides now (by default: the process
        # ends, as it would have without the sweep).
        signal.raise_signal(stop.signum)
    return result


def _result(session: Session, code: int, elapsed_s: float) -> SweepResult:
    ending = session.ending
    if ending is not None and ending.state == "cached":
        hits = ending.cached
        best = min(hits, key=lambda e: e.latency_ms)
        by_device, finalists = _of_entries(hits)
        head, each = by_device[best.device], _cached_problems(session, hits)
        if each and each[0].best is not None:  # as a run's: the first problem's
            head, by_device, finalists = each[0].best, each[0].by_device, each[0].finalists
        return SweepResult(
            state="cached", run_dir=Path(best.run_dir), exit_code=code, best=head,
            by_device=by_device, finalists=finalists, elapsed_s=elapsed_s, by_problem=each)
    from sweep.run.rundir import RunDir

    if not RunDir(session.path).meta.exists():  # stopped before the run began
        return SweepResult(state="interrupted", run_dir=None, best=None, exit_code=code,
                           elapsed_s=elapsed_s)
    return _from_run_dir(session.path, ending.state if ending else None, code, elapsed_s)


def _cached_problems(session: Session, hits: list[Any]) -> list[ProblemBest]:
    """A sweep over problems answered from the cache: as its run would have given it."""
    each = [(dict(p), *_of_entries([e for e in hits if all(
        e.problem.get(k) == v for k, v in p.items())]))  # p may lack the kernel's defaults
        for p in session.spec.problems]  # none: a sweep of one problem
    return [ProblemBest(p, min(d.values(), key=lambda b: b.latency_ms, default=None), d, f)
            for p, d, f in each]


def _of_entries(hits: list[Any]) -> tuple[dict[str, BestConfig], list[dict[str, Any]]]:
    """Cache entries as a run's bests by device type, and the finalists that chose them."""
    by_device, finalists = {}, []
    for e in hits:
        index, chose = _in_its_run(e)
        by_device[e.device] = BestConfig(dict(e.config), e.latency_ms, e.device, index)
        finalists += chose
    return by_device, finalists


def _in_its_run(entry: Any) -> tuple[int | None, list[dict[str, Any]]]:
    """A cache entry's index in the table of the run it came from, and the finalists that
    chose it there, from that run's best.json (None and [] where it says otherwise; in a
    run over problems, its problem's)."""
    from storage.best_file import read_best

    found = read_best(Path(entry.run_dir) / "best.json", entry.fingerprint)
    if found is None:
        return None, []
    choice: Choice | None = found.choice
    if found.by_problem:  # a run over problems: the entry's problem's
        choice = next((p.choice for p in found.by_problem
                       if p.problem == dict(entry.problem)), None)
    mine = choice.by_device.get(entry.device) if choice is not None else None
    if choice is None or mine is None or \
            any(mine.config.get(k) != v for k, v in entry.config.items()):
        return None, []
    return mine.index, [f for f in choice.finalists
                        if f.get("device", entry.device) == entry.device]


def _from_run_dir(path: Path, state: str | None, code: int | None,
                  elapsed_s: float) -> SweepResult:
    from storage.snapshot import SnapshotError, read_snapshot
    from sweep.run.rundir import RunDir

    try:
        snap = read_snapshot(RunDir(path).snapshot)
    except SnapshotError:  # a run killed before its first snapshot: the journal has it
        return SweepResult(state=state or "interrupted", run_dir=path, best=None,
                           exit_code=code, elapsed_s=elapsed_s)
    return SweepResult(
        state=state or snap.state, run_dir=path, exit_code=code,
        best=_best_in(snap.best) if snap.best else None,
        by_device={d: _best_in(b) for d, b in snap.by_device.items()},
        finalists=list(snap.finalists), counts=dict(snap.counts), total=snap.total,
        done=snap.done, elapsed_s=elapsed_s,
        by_problem=_problems(path, snap))


def _problems(path: Path, snap: Snapshot) -> list[ProblemBest]:
    """Each problem's best, from best.json; while a run goes on, from the snapshot (as
    `best` is): best.json is then an earlier session's, or none."""
    from storage.best_file import read_best

    found = read_best(path / "best.json", snap.fingerprint) if snap.state != "running" \
        else None
    problems = found.by_problem if found is not None else snap.problems()
    return [ProblemBest(dict(p.problem), _best_in(p.choice.best) if p.choice.best else None,
                        {d: _best_in(b) for d, b in p.choice.by_device.items()},
                        list(p.choice.finalists))
            for p in problems]


def _best_in(b: Best) -> BestConfig:
    return BestConfig(dict(b.config), b.latency_ms, b.device, b.index)


def _check_plain(value: object, where: str) -> None:
    """A spec given as a mapping holds what a YAML spec can: else its YAML would (a set is
    a mapping of nulls there) be refused at a line of a file the caller never saw."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SpecError(f"spec: {where or 'the spec'}: keys must be strings, got "
                                f"{clip_repr(key)}")
            _check_plain(item, f"{where}.{key}" if where else key)
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            _check_plain(item, f"{where}[{k}]")
    elif isinstance(value, (set, frozenset)):
        raise SpecError(f"spec: {where}: expected a list, got a {type(value).__name__}")
    elif not isinstance(value, (str, int, float, bool)) and value is not None:
        raise SpecError(f"spec: {where}: expected a string, number, boolean, null, list "
                        f"or mapping, got an object of type {type(value).__name__}")


@contextlib.contextmanager
def _spec_file(spec: SpecLike) -> Iterator[tuple[Path, str]]:
    """A spec file for `spec`: the path itself, or the mapping written as YAML in a
    temporary directory (kept for the whole call: the kernel is imported from it while Ray
    starts). Yields the path and what messages should call it ("" for a real file)."""
    if not isinstance(spec, Mapping):
        yield Path(spec), ""
        return
    import yaml

    _check_plain(spec, "")
    doc = dict(spec)
    replay = doc.get("replay")
    if isinstance(replay, Mapping) and isinstance(replay.get("table"), str):
        doc["replay"] = {**replay, "table": str(Path(replay["table"]).absolute())}
    with tempfile.TemporaryDirectory(prefix="sweep-spec-") as where:
        path = Path(where) / "sweep.yaml"  # a spec without a name is named after its file
        try:
            path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        except (yaml.YAMLError, ValueError, OSError) as e:
            raise SpecError(f"spec: cannot be written as YAML ({e})") from None
        yield path, "spec"


__all__ = ["BestConfig", "ProblemBest", "SpecError", "SweepResult", "load", "resume", "run"]
