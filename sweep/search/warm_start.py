"""Warm start: a search's first configs come from the nearest cached sweep of the same
kernel (another problem size, another GPU type), so that a new sweep begins where the
nearest old one ended. Decided once, when a run is created, and kept in its run.json:
the cache may change before a resume, the run's decisions may not."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import cache
from storage.readback import ReadBackError, scalar
from storage.table import read_parquet
from sweep.spec import Spec
from sweep.spec.space import Space


@dataclass(frozen=True)
class WarmStart:
    indices: list[int]  # configs of this space, to run first (the nearest's best first)
    source: str  # the run directory they came from


def nearest(kernel: str, kernel_source: str, problem: Mapping[str, Any],
            fixed: Mapping[str, Any], backend: str,
            root: Path | None = None) -> cache.CacheEntry | None:
    """The complete cached sweep of this kernel on this backend whose problem (and fixed
    arguments) are nearest; the same kernel source is nearer than another. Ties go to the
    faster, then by name."""
    entries = [e for e in cache.of_kernel(kernel, root) if e.backend == backend and not e.partial]
    if not entries:
        return None
    return min(entries, key=lambda e: (cache.distance(problem, e.problem) +
                                       cache.distance(fixed, e.fixed) +
                                       (e.kernel_source != kernel_source) * 0.5,
                                       e.latency_ms, e.run_dir, e.device))


def top_configs(entry: cache.CacheEntry, n: int) -> list[dict[str, Any]]:
    """The entry's best, then the fastest others its run recorded on that device (while
    its run directory is there to read, and holds a trial table: anything else there is
    read as no table)."""
    configs = [dict(entry.config)]
    path = Path(entry.run_dir) / "trials.parquet"
    try:  # gone, or anything but a regular file, is no table
        table = read_parquet(path, columns=["config", "status", "latency_ms", "device"])
        if [table.schema.field(c).type for c in ("config", "status", "device")] != \
                [pa.string()] * 3 or not pa.types.is_floating(table.schema.field(
                    "latency_ms").type):
            return configs
        mask = pc.and_(pc.equal(table["status"], "ok"),
                       pc.equal(table["device"], entry.device))
        ok = table.filter(mask)
        ok = ok.take(pc.sort_indices(ok, sort_keys=[("latency_ms", "ascending")])[:n])
        texts = ok.column("config").to_pylist()
    except (OSError, ReadBackError, ValueError, pa.ArrowException):  # not a trial table
        return configs
    for text in texts:
        try:
            config = json.loads(text) if text is not None else None
        except ValueError:
            continue
        if isinstance(config, dict) and config not in configs:
            configs.append(config)
    return configs[:n]


def indices_of(space: Space, configs: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each config's index in the space, in order; one the space lacks (another
    parameter, a value not listed, constrained away) is left out. A config without some
    of the space's parameters (the interpreter's cache entries leave launch options out)
    stands for the first config that matches it on the rest."""
    out: list[int] = []
    for config in configs:
        if not set(config) <= set(space.names) or not all(map(scalar, config.values())):
            continue
        match = np.ones(len(space), dtype=bool)
        for name, value in config.items():
            codes = np.flatnonzero(space.tables[name] == value)
            if len(codes) == 0:
                match[:] = False
                break
            match &= space.codes[name] == codes[0]
            if name in space.present:  # code 0 also stands for unset
                match &= space.present[name]
        # Where configs leave parameters unset, one that leaves this one's unset too.
        exact = match.copy()
        for name, present in space.present.items():
            if name not in config:
                exact &= ~present
        found = np.flatnonzero(exact if exact.any() else match)
        if len(found) and int(found[0]) not in out:
            out.append(int(found[0]))
    return out


def warm_start(spec: Spec, space: Space, backend: str,
               root: Path | None = None) -> WarmStart | None:
    n = spec.search.warm_start
    if n <= 0 or spec.search.exhaustive:
        return None
    if spec.problems:
        return _each_problem(spec, space, backend, n, root)
    entry = nearest(spec.kernel, spec.kernel_source, spec.problem, spec.fixed_as_written,
                    backend, root)
    if entry is None:
        return None
    indices = indices_of(space, top_configs(entry, n))
    return WarmStart(indices, entry.run_dir) if indices else None


def _each_problem(spec: Spec, space: Space, backend: str, n: int,
                  root: Path | None) -> WarmStart | None:
    """A warm start for each problem of a sweep over problems, from the cached sweep
    nearest to it (the sweep's indices); a problem with none waits for its neighbour
    (sweep/search/per_problem.py)."""
    indices: list[int] = []
    sources: list[str] = []
    for p, problem in enumerate(spec.each_problem()):
        entry = nearest(spec.kernel, spec.kernel_source, problem, spec.fixed_as_written,
                        backend, root)
        if entry is None:
            continue
        start = space.starts[p]
        mine = [start + i for i in indices_of(space.part(p), top_configs(entry, n))]
        indices += mine
        if mine and entry.run_dir not in sources:
            sources.append(entry.run_dir)
    if not indices:
        return None
    more = f" and {len(sources) - 1} more" if len(sources) > 1 else ""
    return WarmStart(indices, sources[0] + more)
