"""`sweep best DIR|SPEC`: a run's best config, or the cached best for a spec's kernel and
problem, as JSON and as a `triton.Config(...)` line to paste into code.

One entry per device type (a run on several GPU types, a cache with entries for several
devices), and in a run over problems (`problems:`) per problem, in the spec's order;
`--json` prints them as one JSON list, for scripts. `--python PATH` writes a run's bests
as a module of their own, a dispatch table for launch code (sweep/dispatch.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from sweep import EXIT_OK
from sweep.console import say
from sweep.tuned import config_line

if TYPE_CHECKING:
    from storage.best_file import BestFile, Choice
    from sweep.dispatch import Table
    from sweep.run.rundir import RunDir
    from sweep.spec import Spec


def show_best(target: Path, as_json: bool, out: Console, python: Path | None = None) -> int:
    """target: a run directory (its best.json) or a spec (the best-config cache). python:
    where to write the run's dispatch module instead ("-": stdout)."""
    from sweep.spec import SpecError

    if python is not None:
        return write_python(target, python, out)
    if target.is_dir():
        entries, empty = _of_run(target)
    elif target.exists():
        entries, empty = _of_spec(target)
    else:
        raise SpecError(f"{target}: no such run directory or spec file")
    if as_json:
        say(out, json.dumps(entries, indent=2, sort_keys=True))
        return EXIT_OK
    if not entries:
        say(out, empty)
    for entry in entries:
        say(out, json.dumps(entry, sort_keys=True))
        say(out, config_line(entry["config"]) if entry["config"] is not None
            else "no config succeeded for this problem")
    return EXIT_OK


def _of_run(path: Path) -> tuple[list[dict[str, Any]], str]:
    found = run_best(path)
    run_dir = str(path.resolve())
    problems = found.by_problem
    if problems and any(p.choice.best is not None for p in problems):
        return [e for p in problems
                for e in _entries(p.choice, found.partial, run_dir, p.problem)], ""
    if problems or found.choice.best is None:
        return [], f"{path}: no config succeeded"
    return _entries(found.choice, found.partial, run_dir), ""


def _entries(choice: Choice, partial: bool, run_dir: str,
             problem: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """A best's entry for each device type, fastest first: best.json's head, or one
    problem's (then each names it; one no config succeeded for is one entry of nulls, so
    that the list keeps a place for every problem)."""
    named = {"problem": dict(problem)} if problem is not None else {}
    if choice.best is None:
        return [{"device": None, "config": None, "latency_ms": None, "index": None,
                 "partial": partial, "run_dir": run_dir, **named}]
    entries = [{"device": device, "config": b.config, "latency_ms": b.latency_ms,
                "index": b.index, "partial": partial, "run_dir": run_dir, **named}
               for device, b in choice.by_device.items()]
    return sorted(entries, key=lambda e: (e["latency_ms"], e["index"]))


def run_best(path: Path) -> BestFile:
    """The run's best.json, checked as this run's (SpecError, one line, where the folder
    is no run or its best.json is missing, damaged or not yet written)."""
    from storage.best_file import read_best
    from storage.lock import holder
    from sweep.run.rundir import RunDir, read_meta
    from sweep.spec import SpecError

    run = RunDir(path)
    if not run.meta.exists():
        raise SpecError(f"{path}: not a sweep run directory (no run.json)")
    found = read_best(run.best, read_meta(run)["fingerprint"])
    if found is None:
        busy = holder(path)
        if busy is not None:
            raise SpecError(f"{run.best}: not written yet: the run is in use by a sweep "
                            f"({busy}), which writes it when it stops")
        raise SpecError(f"{run.best}: missing or damaged; `sweep resume {path}` rebuilds it")
    return found


def _of_spec(path: Path) -> tuple[list[dict[str, Any]], str]:
    from storage.cache import cache_dir, lookup_many
    from sweep.spec import load_spec

    spec = load_spec(path)
    # Each of a sweep over problems, by its place in the spec's order.
    found = [(p, e) for p, hits in enumerate(lookup_many(
        spec.kernel, spec.kernel_source, spec.each_problem(), spec.fixed_as_written))
        for e in hits]
    entries = [{**({"problem": dict(e.problem)} if spec.problems else {}),
                "device": e.device, "backend": e.backend, "config": dict(e.config),
                "latency_ms": e.latency_ms, "partial": e.partial, "run_dir": e.run_dir,
                "run_dir_gone": e.run_gone,
                "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.written_at)),
                "versions": dict(e.versions), "fingerprint": e.fingerprint,
                "file": str(_where(e))}
               for _, e in sorted(found, key=lambda pe: (pe[0], pe[1].backend, pe[1].device,
                                                         pe[1].latency_ms))]
    fixed = f" fixed {json.dumps(dict(spec.fixed_as_written))}" if spec.fixed_as_written \
        else ""
    problems = json.dumps([dict(p) for p in spec.problems]) if spec.problems else \
        json.dumps(dict(spec.problem))
    return entries, (f"no cached best for {spec.kernel} {problems}"
                     f"{fixed} in {cache_dir()}")


def _where(entry: Any) -> Path:
    """The entry's file: in its folder, or flat in the cache where an earlier version
    wrote it and nothing has written to the cache since."""
    from storage.cache import cache_dir

    path = entry.path()
    return path if path.exists() else cache_dir() / f"{entry.key}.json"


def write_python(target: Path, dest: Path, out: Console) -> int:
    """`sweep best DIR --python PATH`: the run's bests as a dispatch module (see
    sweep/dispatch.py), at PATH or on stdout ("-"). A partial run's is written too, marked
    so, as `sweep best` shows a partial run's best."""
    from sweep.dispatch import DispatchError, module_text, write_module
    from sweep.spec import SpecError

    if not target.is_dir():
        raise SpecError(f"{target}: --python takes a run directory" +
                        ("" if target.exists() else " (there is none)"))
    try:
        text = module_text(_table(target, run_best(target)))
        if str(dest) == "-":
            out.file.write(text)
            out.file.flush()
            return EXIT_OK
        write_module(dest, text)
    except DispatchError as e:
        raise SpecError(str(e)) from None
    say(out, f"wrote {dest}: the dispatch table of {target}")
    return EXIT_OK


def _table(path: Path, found: BestFile) -> Table:
    """What the module holds: each problem's best (the kernel's defaults merged into each
    problem), and which of its keys no problem wrote (the defaults a caller may leave
    out)."""
    from storage.best_file import ProblemChoice
    from storage.readback import finite, read_json
    from sweep.dispatch import Table, Tuned
    from sweep.run.rundir import RunDir, read_meta
    from sweep.spec import LAUNCH_OPTIONS

    run = RunDir(path)
    meta = read_meta(run)
    spec = _declared_spec(run, meta["declared"])
    written = {*spec.problem_as_written, *(k for e in spec.problem_entries for k in e)}
    problems = found.by_problem or [ProblemChoice(
        _merged_problem(run, meta["fingerprint"], spec.problem_as_written), 0, 0,
        found.choice)]
    defaults = {k: v for k, v in problems[0].problem.items()
                if k not in written and all(p.problem.get(k) == v for p in problems)}
    try:
        started = read_json(run.meta)["created_at"]
    except (OSError, ValueError, KeyError, TypeError):
        started = None
    tuned = [Tuned(problem=p.problem, config=best.config if best else None,
                   device=best.device if best else None,
                   latency_ms=best.latency_ms if best else None,
                   index=best.index if best else None,
                   by_device={d: b.config for d, b in p.choice.by_device.items()})
             for p in problems for best in [p.choice.best]]
    return Table(kernel=spec.kernel, name=meta["name"], run_dir=str(path.resolve()),
                 fingerprint=meta["fingerprint"],
                 started_at=started if finite(started, low=0.0, high=1e11) else None,
                 partial=found.partial, problems=tuned, defaults=defaults,
                 launch_options=LAUNCH_OPTIONS)


def _declared_spec(run: RunDir, declared: str) -> Spec:
    """The run's spec.yaml as the file alone decides it (no kernel imported), checked
    against the run's record of it, as `sweep resume` checks it."""
    from sweep.run.opening import declared_spec

    return declared_spec(run, declared, "restore it")[0]


def _merged_problem(run: RunDir, fingerprint: str,
                    written: Mapping[str, Any]) -> dict[str, Any]:
    """A run of one problem: that problem with the kernel's defaults merged in, as the
    trial table's metadata records it (best.json holds it only for a run over problems)."""
    import pyarrow as pa

    from storage.readback import scalar
    from storage.table import read_parquet_schema
    from sweep.spec import SpecError

    problem: Any = None
    try:
        info = read_parquet_schema(run.trials).metadata or {}
        if info.get(b"fingerprint") == fingerprint.encode():
            problem = json.loads(info[b"spec"])["problem"]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        problem = None
    if not isinstance(problem, dict) or not all(
            isinstance(k, str) and scalar(v) for k, v in problem.items()) or \
            any(problem.get(k) != v for k, v in written.items()):
        raise SpecError(f"{run.trials}: missing, damaged or another run's (its metadata "
                        f"holds the problem); `sweep resume {run.path}` rebuilds it")
    return problem
