"""When the best-config cache answers a sweep instead of running it, and what a finished
run gives the cache: the policy over storage/cache.py's entries.

A sweep is answered only where this very sweep (its fingerprint) completed before on
every device the run would use, with the same torch and Triton; simulate and replay runs
measure this tool, not a kernel, so nothing answers them and they give nothing.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from actors.backends import traits
from storage import cache
from storage.readback import printable
from storage.records import canonical_json
from sweep.console import say
from sweep.engines import machine
from sweep.engines.runtime import Engine, Placement
from sweep.results.tally import Tally
from sweep.run.assembly import interpreted_options
from sweep.search.warm_start import indices_of
from sweep.spec import Spec
from sweep.spec.space import Space
from sweep_kernels import file_digest, origin_of

Devices = list[tuple[str, dict[str, str]]]  # each device's name and library versions


class CacheAnswers:
    """The cache's answers to one session's sweep. gone: entries that would have answered
    but for their run directory, which is gone (the run says so, and tunes again)."""

    def __init__(self) -> None:
        self.gone: list[cache.CacheEntry] = []

    def before_start(self, spec: Spec, engine: Engine,
                     imported: Callable[[], Spec]) -> tuple[list[cache.CacheEntry], Spec | None]:
        """The answer before the kernel is imported and the engine starts, where this
        machine alone decides the devices (workers on this machine, no device types
        chosen): from files alone where the entries recorded the kernel's source files,
        which are unchanged (milliseconds: neither torch nor the kernel is imported);
        else, where a complete sweep with this spec's declared fingerprint is on record,
        by importing the kernel now (imported(), which costs only a run that is answered).
        Returns the hits, and the imported spec where it answered."""
        if not engine.on_this_machine() or spec.run.accelerator_types is not None:
            return [], None
        devices = machine.local_devices(spec.run.backend)
        if devices is None:
            return [], None
        backend = "interpret" if devices == ["cpu-interpreter"] else "cuda"
        here = cache.library_versions()  # the workers' too: this machine, this Python
        on = [(d, here) for d in devices]
        origin = origin_of(spec.kernel, str(Path.cwd()))
        hits = self._answering([e for e in cache.answered_by_files(
            spec.kernel, spec.declared_fingerprint, backend, origin, file_digest)
            if fits(spec, e)], on, len(spec.each_problem())) if origin else []
        if hits or not cache.declared_somewhere(spec.kernel, spec.declared_fingerprint):
            return hits, None
        full = imported()
        hits = self._answering(candidates(full, backend), on, len(full.each_problem()))
        return hits, full if hits else None

    def after_connect(self, spec: Spec, engine: Engine, backend: str, placement: Placement,
                      stop_requested: Callable[[], bool]) -> list[cache.CacheEntry]:
        """The cached best on each device this run would tune on, if this very sweep
        completed on each before, with these torch and Triton versions; else nothing."""
        found = candidates(spec, backend)
        if not found:
            return []
        if traits(backend).interpreted:
            devices: Devices | None = [("cpu-interpreter", cache.library_versions())]
        else:  # only now, with an answer likely: it starts a process on a GPU
            devices = engine.device_names(sorted(set(placement.kinds)) or [""], stop_requested)
        return self._answering(found, devices or [], len(spec.each_problem()))

    def _answering(self, found: list[cache.CacheEntry], devices: Devices,
                   problems: int = 1) -> list[cache.CacheEntry]:
        """cache.answering among the entries whose run is still there: an answer names
        where its best came from, and with that gone there is nothing to inspect. A sweep
        over problems is answered whole, every problem on every device, or not at all."""
        here = [e for e in found if not e.run_gone]
        self.gone += [e for e in found if e.run_gone and e not in self.gone
                      and cache.answering([e], devices)]
        groups: dict[str, list[cache.CacheEntry]] = {}
        for e in here:
            groups.setdefault(canonical_json(dict(e.problem)), []).append(e)
        answers = [cache.answering(group, devices) for group in groups.values()]
        if len(groups) != problems or not all(answers):
            return []
        return [e for answer in answers for e in answer]


def candidates(spec: Spec, backend: str) -> list[cache.CacheEntry]:
    """Cache entries that this very sweep (its fingerprint) completed on some device."""
    if not traits(backend).kernel:
        return []
    found = cache.lookup_many(spec.kernel, spec.kernel_source, spec.each_problem(),
                              spec.fixed_as_written)
    return [e for hits in found for e in hits
            if e.backend == backend and not e.partial and spec.fingerprint in e.runs
            and fits(spec, e)]


def fits(spec: Spec, entry: cache.CacheEntry) -> bool:
    """Whether the entry's config sets only parameters this sweep tunes: one that names
    others (a hand edit, another sweep that tuned more) cannot be its answer, though it
    may lie outside the space's values (the best any sweep of that key found)."""
    return set(entry.config) <= set(spec.every_space)


def store_best(spec: Spec, path: Path, tally: Tally, backend: str, partial: bool,
               err: Console, versions: Mapping[str, Mapping[str, str]]) -> None:
    """An entry per problem and device type, as separate runs would make: a config tuned
    on one type says little of another. A better best cached before (by another run)
    stays."""
    if spec.validation is None:
        say(err, "validation is off: the best-config cache takes only validated bests")
        return
    here = cache.library_versions()  # the workers' unless none came up (all done before)
    noise = interpreted_options(spec, backend)
    run_dir = str(path.resolve())
    problems = spec.each_problem()
    each = [(problems[p], tally.problem(p)) for p in range(len(problems))]
    entries = [cache.CacheEntry(
        kernel=spec.kernel, kernel_source=spec.kernel_source,
        problem=dict(problem), backend=backend, device=best.device,
        # The interpreter ignores launch options: a pick among them is noise.
        config={k: v for k, v in best.config.items() if k not in noise},
        latency_ms=best.latency_ms, fingerprint=spec.fingerprint, run_dir=run_dir,
        partial=partial, written_at=time.time(),
        versions=versions.get(best.device) or here,
        fixed=dict(spec.fixed_as_written), runs=(spec.fingerprint,),
        declared=(spec.declared_fingerprint,), host=socket.gethostname(),
        sources=dict(spec.kernel_files))
        for problem, mine in each for best in mine.by_device.values()]
    try:
        stored = cache.store_many(entries, unfit=lambda held: not fits(spec, held))
        for entry, (kept, _) in zip(entries, stored):
            if kept.run_dir != run_dir:
                of = f" for {canonical_json(entry.problem)}" if spec.problems else ""
                say(err, f"the best-config cache keeps its entry{of} from "
                         f"{printable(kept.run_dir, 4096)}"
                         f"{' (partial)' if kept.partial else ''}: {kept.latency_ms:.4g}"
                         f" ms on {printable(kept.device)}, this run's best "
                         f"{entry.latency_ms:.4g} ms")
    except OSError as e:  # the run itself is done and written; only the cache missed it
        say(err, f"warning: the best-config cache was not updated ({e.strerror or e})")


def print_cached(out: Console, spec: Spec, space: Space,
                 hits: list[cache.CacheEntry]) -> None:
    order = spec.each_problem()
    # An entry's problem is one of the spec's, perhaps with the kernel's defaults merged
    # (a spec read without importing it has none): found by the spec's keys of it, in a
    # table rather than by a walk over the problems per entry.
    keys = list(order[0])

    def form(problem: Mapping[str, Any]) -> str:
        return canonical_json({k: problem.get(k) for k in keys})

    position = {form(p): i for i, p in enumerate(order)}

    def place(e: cache.CacheEntry) -> int:  # the spec's order of problems
        return position.get(form(e.problem), len(order))

    for e in sorted(hits, key=place) if spec.problems else hits:
        of = f" {canonical_json(dict(e.problem))}" if spec.problems else ""
        p = place(e)
        own = space.part(p) if spec.problems and p < len(order) else space
        say(out, f"sweep {spec.name}: cached — this sweep of {e.kernel}{of} completed on "
                 f"{printable(e.device)} before; the best any sweep found there is from "
                 f"{printable(e.run_dir, 4096)} "
                 f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(e.written_at))})")
        outside = "" if indices_of(own, [e.config]) else " (outside this sweep's space)"
        config = json.dumps(dict(e.config), sort_keys=True)  # escapes control characters
        say(out, f"  best: {config} "
                 f"{e.latency_ms:.4g} ms{outside}")
    say(out, "  nothing was run; pass --force to tune again")


def say_gone(err: Console, gone: list[cache.CacheEntry]) -> None:
    for entry in gone:
        say(err, f"the best-config cache has this sweep's best on "
                 f"{printable(entry.device)}, from {printable(entry.run_dir, 4096)}, "
                 "which is gone: tuning again")
