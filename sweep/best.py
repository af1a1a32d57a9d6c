"""`sweep best DIR|SPEC`: a run's best config, or the cached best for a spec's kernel and
problem, as JSON and as a `triton.Config(...)` line to paste into code.

One entry per device type (a run on several GPU types, a cache with entries for several
devices); `--json` prints them as one JSON list, for scripts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from sweep import EXIT_OK
from sweep.console import say
from sweep.tuned import config_line


def show_best(target: Path, as_json: bool, out: Console) -> int:
    """target: a run directory (its best.json) or a spec (the best-config cache)."""
    from sweep.spec import SpecError

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
        say(out, config_line(entry["config"]))
    return EXIT_OK


def _of_run(path: Path) -> tuple[list[dict[str, Any]], str]:
    from storage.lock import holder
    from storage.snapshot import read_best
    from sweep.run.rundir import RunDir, read_meta
    from sweep.spec import SpecError

    run = RunDir(path)
    if not run.meta.exists():
        raise SpecError(f"{path}: not a sweep run directory (no run.json)")
    doc = read_best(run.best, read_meta(run)["fingerprint"])
    if doc is None:
        busy = holder(path)
        if busy is not None:
            raise SpecError(f"{run.best}: not written yet: the run is in use by a sweep "
                            f"({busy}), which writes it when it stops")
        raise SpecError(f"{run.best}: missing or damaged; `sweep resume {path}` rebuilds it")
    if doc["config"] is None:
        return [], f"{path}: no config succeeded"
    by_device = doc.get("by_device") or {doc["device"]: doc}
    entries = [{"device": device, "config": b["config"], "latency_ms": b["latency_ms"],
                "index": b["index"], "partial": doc["partial"], "run_dir": str(path.resolve())}
               for device, b in by_device.items()]
    return sorted(entries, key=lambda e: (e["latency_ms"], e["index"])), ""


def _of_spec(path: Path) -> tuple[list[dict[str, Any]], str]:
    from storage.cache import cache_dir, lookup
    from sweep.spec import load_spec

    spec = load_spec(path)
    found = lookup(spec.kernel, spec.kernel_source, spec.problem, spec.fixed_as_written)
    entries = [{"device": e.device, "backend": e.backend, "config": dict(e.config),
                "latency_ms": e.latency_ms, "partial": e.partial, "run_dir": e.run_dir,
                "run_dir_gone": e.run_gone,
                "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.written_at)),
                "versions": dict(e.versions), "fingerprint": e.fingerprint,
                "file": str(cache_dir() / f"{e.key}.json")}
               for e in sorted(found, key=lambda e: (e.backend, e.device, e.latency_ms))]
    fixed = f" fixed {json.dumps(dict(spec.fixed_as_written))}" if spec.fixed_as_written \
        else ""
    return entries, (f"no cached best for {spec.kernel} {json.dumps(dict(spec.problem))}"
                     f"{fixed} in {cache_dir()}")
