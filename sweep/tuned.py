"""Tuned configs at run time: what a user's launch code calls to get the best config the
sweeps found for this kernel, problem and device, or a fallback when none did.

A problem that was not tuned is answered from the nearest one that was, of the same kernel
(its source), device, library versions and fixed arguments, with the same keys and every
value but its sizes alike (the dtype, a layout): the distance is the sum over its sizes of
|log2| of their ratio, so M = 16 is as near to 64 as 1024 is to 4096 (storage/cache.py's
distance). Ties go to a complete entry, then to the larger sizes. nearest=False answers
only the very problem.

Light on purpose (no Ray, no pyarrow): it runs in the user's program, once per distinct
problem (the answer is kept for the life of the process).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, overload

from storage.cache import (
    CacheEntry,
    cache_dir,
    distance,
    entry_key,
    group_dir,
    library_versions,
    of_group,
    read,
    sizes_apart,
)
from storage.readback import scalar
from sweep_kernels import load_kernel, source_digest

# Keyword arguments of a Triton launch rather than of the kernel: triton.Config keeps them
# apart from its kwargs.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass(frozen=True)
class TunedEntry(CacheEntry):
    """A cache entry as tuned_entry found it: `problem` is the one it was tuned for (merged
    with the kernel's defaults), `distance` how far that is from the one asked (0: that
    very problem; see the module's docstring)."""

    distance: float = 0.0


@overload
def tuned_config(kernel: str, problem: Mapping[str, Any], *, default: Mapping[str, Any],
                 fixed: Mapping[str, Any] | None = None, device: str | None = None,
                 partial: bool = False, nearest: bool = True) -> dict[str, Any]: ...


@overload
def tuned_config(kernel: str, problem: Mapping[str, Any], *, default: None = None,
                 fixed: Mapping[str, Any] | None = None, device: str | None = None,
                 partial: bool = False, nearest: bool = True) -> dict[str, Any] | None: ...


def tuned_config(kernel: str, problem: Mapping[str, Any], *,
                 default: Mapping[str, Any] | None = None,
                 fixed: Mapping[str, Any] | None = None, device: str | None = None,
                 partial: bool = False, nearest: bool = True) -> dict[str, Any] | None:
    """The cached best config of `kernel` (named as in a spec: "matmul" or "pkg.mod:attr")
    for `problem` (merged with the kernel's defaults, as a spec's is) on this process's
    device, else a copy of `default` (None without one).

    fixed: the kernel's fixed arguments exactly as the spec's `fixed:` wrote them (the
    kernel record's own defaults are part of its source). device: a device name as the
    trial table spells it ("NVIDIA H100 80GB HBM3", "cpu-interpreter"); by default the
    current CUDA device, or the interpreter when TRITON_INTERPRET=1 or no GPU is present.
    Only a complete sweep's best counts, unless partial=True. A problem not tuned is
    answered from the nearest tuned one (see the module's docstring), unless
    nearest=False."""
    entry = tuned_entry(kernel, problem, device, fixed, nearest=nearest, partial=partial)
    if entry is None or (entry.partial and not partial):
        return dict(default) if default is not None else None
    return dict(entry.config)


def tuned_entry(kernel: str, problem: Mapping[str, Any], device: str | None = None,
                fixed: Mapping[str, Any] | None = None, *, nearest: bool = True,
                partial: bool = True) -> TunedEntry | None:
    """The cache entry behind tuned_config (its latency, provenance, the problem it was
    tuned for and how far that is from this one), if any. partial: whether an
    interrupted sweep's entry may answer."""
    if not _answerable(problem, fixed or {}):
        return None
    backend, name = _device(device)
    asked = (kernel, tuple(sorted(problem.items())), tuple(sorted((fixed or {}).items())),
             backend, name)
    exact = _lookup(*asked)
    if exact is not None and (partial or not exact.partial):
        return _tuned(exact, 0.0)
    found = _nearest(*asked, partial) if nearest else None
    return found or (_tuned(exact, 0.0) if exact is not None else None)


def _answerable(problem: Mapping[str, Any], fixed: Mapping[str, Any]) -> bool:
    """Whether a cache entry could be keyed by these: names that are strings, values a
    spec can hold (a tensor, a NaN or an integer past a float's range never are). Launch
    code asking with others gets its default: it is never made to fail here."""
    def value(v: Any) -> bool:
        return scalar(v) or v is None or (isinstance(v, (list, tuple)) and all(map(value, v)))

    return all(isinstance(k, str) and scalar(v) for k, v in problem.items()) and \
        all(isinstance(k, str) and value(v) for k, v in fixed.items())


def triton_config(config: Mapping[str, Any]) -> Any:
    """A config as a triton.Config: launch options as its keywords, the rest its kwargs."""
    import triton

    return triton.Config({k: v for k, v in config.items() if k not in LAUNCH_OPTIONS},
                         **{k: v for k, v in config.items() if k in LAUNCH_OPTIONS})


def config_line(config: Mapping[str, Any]) -> str:
    """triton_config(config) as Python source, for pasting into an @triton.autotune list."""
    kwargs = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = "".join(f", {k}={config[k]!r}" for k in LAUNCH_OPTIONS if k in config)
    return f"triton.Config({kwargs!r}{options})"


def _device(device: str | None) -> tuple[str, str]:
    if device == "cpu-interpreter" or (device is None and _interpreting()):
        return "interpret", "cpu-interpreter"
    if device is None:
        import torch

        device = torch.cuda.get_device_name(torch.cuda.current_device())
    return "cuda", device


def _interpreting() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return not torch.cuda.is_available()


def _lookup(kernel: str, problem: tuple[tuple[str, Any], ...],
            fixed: tuple[tuple[str, Any], ...], backend: str, device: str
            ) -> CacheEntry | None:
    """A complete run's entry is kept for the life of the process; anything else is
    looked up again next time (a sweep may have finished meanwhile), which costs a stat
    (and a read, for a partial entry)."""
    root = cache_dir()
    key = (kernel, problem, fixed, backend, device, str(root))
    entry = _found.get(key)
    if entry is None:
        name = f"{_key(*key[:5])}.json"
        # Where this version writes it, else where an earlier one did (flat in the root).
        entry = read(_group(kernel, problem, fixed, backend, device, root) / name) or \
            read(root / name)
        if entry is not None and not entry.partial:  # a partial one may be replaced
            _found[key] = entry
    return entry


_found: dict[tuple[Any, ...], CacheEntry] = {}
# The nearest answer to each miss (None: none), with the modification times of the
# folders that hold what could answer it (the cache's root, the kernel's folder, the
# group's) when it was found: an entry written or replaced there since (a rename into the
# folder) changes one, so a launch pays three stats, and a write to another kernel's or
# group's entries none of them.
_near: dict[tuple[Any, ...], tuple[tuple[int | None, ...], TunedEntry | None]] = {}


def _nearest(kernel: str, problem: tuple[tuple[str, Any], ...],
             fixed: tuple[tuple[str, Any], ...], backend: str, device: str,
             partial: bool) -> TunedEntry | None:
    """The nearest entry that differs from the problem only in sizes."""
    root = cache_dir()
    group = _group(kernel, problem, fixed, backend, device, root)
    stamp = tuple(_mtime(p) for p in (root, group.parent, group))
    if stamp[0] is None:  # no cache yet
        return None
    key = (kernel, problem, fixed, backend, device, str(root), partial)
    known = _near.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    found = _scan(kernel, problem, fixed, backend, device, partial)
    _near[key] = (stamp, found)
    return found


def _scan(kernel: str, problem: tuple[tuple[str, Any], ...],
          fixed: tuple[tuple[str, Any], ...], backend: str, device: str,
          partial: bool) -> TunedEntry | None:
    source, merged = _identity(kernel, problem)
    near = [e for e in of_group(kernel, source, backend, device, library_versions(),
                                dict(fixed))
            if (partial or not e.partial) and sizes_apart(merged, e.problem)]
    if not near:
        return None
    best = min(near, key=lambda e: (distance(merged, e.problem), e.partial,
                                    [-e.problem[k] for k in sorted(e.problem)
                                     if merged[k] != e.problem[k]]))
    return _tuned(best, distance(merged, best.problem))


def _tuned(entry: CacheEntry, how_far: float) -> TunedEntry:
    return TunedEntry(**{f.name: getattr(entry, f.name) for f in fields(CacheEntry)},
                      distance=how_far)


@functools.lru_cache(maxsize=256)
def _identity(kernel: str, problem: tuple[tuple[str, Any], ...]
              ) -> tuple[str, dict[str, Any]]:
    """The kernel's source digest (hashing it is the costly part, done once) and the
    problem merged with its defaults."""
    record = load_kernel(kernel)
    unknown = [k for k, _ in problem if k not in record.problem_defaults]
    if unknown:  # a misspelt key would be a silent miss, on every launch
        raise ValueError(f"tuned_config: {kernel} has no problem key "
                         f"{', '.join(map(repr, unknown))} (expected one of "
                         f"{', '.join(record.problem_defaults)})")
    return source_digest(kernel, record), {**record.problem_defaults, **dict(problem)}


def _mtime(path: os.PathLike[str]) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=256)
def _group(kernel: str, problem: tuple[tuple[str, Any], ...],
           fixed: tuple[tuple[str, Any], ...], backend: str, device: str, root: Path) -> Path:
    """The folder of the entries that could answer (storage/cache.py's group_dir)."""
    source, _ = _identity(kernel, problem)
    return group_dir(kernel, source, backend, device, library_versions(), dict(fixed), root)


@functools.lru_cache(maxsize=256)
def _key(kernel: str, problem: tuple[tuple[str, Any], ...],
         fixed: tuple[tuple[str, Any], ...], backend: str, device: str) -> str:
    """The entry's key."""
    source, merged = _identity(kernel, problem)
    return entry_key(kernel, source, merged, backend, device, library_versions(),
                     dict(fixed))
