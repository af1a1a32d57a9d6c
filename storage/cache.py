"""The best-config cache: the best config found for a kernel on a device, for later runs,
`sweep best` and a user's launch code (sweep/tuned.py) to look up.

An entry is keyed by everything that decides which config is fastest: the kernel and its
source, the problem, the backend, the device's name and the torch and Triton versions.
It keeps the best any run found (not the last run's), with where and when it was found.
An interrupted sweep's best is a guess: it is written here only when the user asks
(`--cache-partial`), marked `partial`, and never replaces a complete run's.

Laid out as an index, so that a lookup reads only what could answer it, however many
entries other kernels have: `<root>/<kernel>/<group>/<key>.json`, where the kernel's
folder is its name made safe plus a hash of it, and a group is every entry of one kernel
source, backend, device, library versions and fixed arguments (they differ only in the
problem: what a nearest-size lookup compares). Each entry is still one file replaced by
an atomic rename, so concurrent writers need no index of their own to keep consistent.
Entries an earlier version wrote flat in `<root>` are read as well, and moved into their
folders by the next write to the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from storage.atomic import write_bytes_atomically
from storage.durable import fsync_dirs, make_dirs, sync_batch
from storage.readback import ReadBackError, finite, read_json, scalar
from storage.records import canonical_json
from storage.versions import installed_versions


def cache_dir() -> Path:
    root = os.environ.get("SWEEP_CACHE_DIR") or Path.home() / ".cache" / "triton-sweep"
    return Path(root) / "best"


def library_versions() -> dict[str, str]:
    """The torch and Triton of this environment: a new version may change which config is
    fastest, so it is part of an entry's key."""
    return installed_versions({"torch": "torch", "triton": "triton"})


@dataclass(frozen=True)
class CacheEntry:
    kernel: str
    kernel_source: str
    problem: Mapping[str, Any]
    backend: str
    device: str
    config: Mapping[str, Any]
    latency_ms: float
    fingerprint: str
    run_dir: str
    partial: bool
    written_at: float
    versions: Mapping[str, str] = field(default_factory=dict)
    # The kernel's fixed (non-tuned) arguments as the spec writes them (the kernel record's
    # own defaults are part of its source): another value is another kernel to tune.
    fixed: Mapping[str, Any] = field(default_factory=dict)
    # The fingerprints of every complete sweep that tuned this key, whether or not its
    # best is the one kept: `sweep run` of one of these sweeps has nothing left to find.
    runs: tuple[str, ...] = ()
    # Their declared fingerprints (known before the kernel is imported): whether to look
    # here at all before Ray starts.
    declared: tuple[str, ...] = ()
    # The host whose disk run_dir is on ("": not recorded, written before hosts were).
    host: str = ""
    # The kernel's source files and the SHA-256 of each ({}: written before they were):
    # unchanged, they let a sweep be answered without importing the kernel (see
    # answered_by_files).
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def run_gone(self) -> bool:
        """Whether the run its best came from is certainly gone: its directory is missing
        on the host that wrote it (another host's disk says nothing here)."""
        return (not self.host or self.host == socket.gethostname()) and \
            not Path(self.run_dir).is_dir()

    @property
    def key(self) -> str:
        return entry_key(self.kernel, self.kernel_source, self.problem, self.backend,
                         self.device, self.versions, self.fixed)

    def path(self, root: Path | None = None) -> Path:
        """Where this entry's file is in the cache's layout (see the module's docstring)."""
        return group_dir(self.kernel, self.kernel_source, self.backend, self.device,
                         self.versions, self.fixed, root) / f"{self.key}.json"

    def better_than(self, other: CacheEntry) -> bool:
        """A complete run's best beats a partial one's whatever the latency: a stop may
        come before the fastest region of the space was reached."""
        if self.partial != other.partial:
            return not self.partial
        return self.latency_ms < other.latency_ms


# How far apart two problems are when a key differs in other than size: further than
# any size ratio a user would call near (2**4 = 16 times).
UNLIKE = 4.0


def _size(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Between two problems: each size counts as its log2 ratio (M = 16 is as far from 64
    as 1024 is from 4096), each other difference (a dtype, a missing key) as UNLIKE."""
    d = 0.0
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        # A difference of logs, not the log of a ratio: a ratio of sizes far apart (1e-320
        # and 64) underflows to 0 or overflows.
        d += abs(math.log2(x) - math.log2(y)) if _size(x) and _size(y) else UNLIKE  # type: ignore[arg-type]
    return d


def sizes_apart(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two problems have the same keys and differ only in sizes (positive
    numbers): the same dtype and every other value alike."""
    return set(a) == set(b) and all(a[k] == b[k] or (_size(a[k]) and _size(b[k]))
                                    for k in a)


def entry_key(kernel: str, kernel_source: str, problem: Mapping[str, Any], backend: str,
              device: str, versions: Mapping[str, str],
              fixed: Mapping[str, Any] | None = None) -> str:
    what = {"kernel": kernel, "source": kernel_source, "problem": dict(problem),
            "backend": backend, "device": device, "versions": dict(versions)}
    if fixed:
        what["fixed"] = dict(fixed)
    return hashlib.sha256(canonical_json(what).encode()).hexdigest()[:24]


def _kernel_folder(kernel: str) -> str:
    """A kernel's folder: its name made safe for a file name (readable, not unique) and a
    hash of it (unique)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", kernel)[:48].lstrip(".")
    return f"{readable}-{hashlib.sha256(kernel.encode(errors='surrogatepass')).hexdigest()[:12]}"


def group_dir(kernel: str, kernel_source: str, backend: str, device: str,
              versions: Mapping[str, str], fixed: Mapping[str, Any] | None = None,
              root: Path | None = None) -> Path:
    """The folder of every entry that differs from one another only in its problem."""
    what = {"kernel": kernel, "source": kernel_source, "backend": backend, "device": device,
            "versions": dict(versions), "fixed": dict(fixed or {})}
    group = hashlib.sha256(canonical_json(what).encode()).hexdigest()[:24]
    return (root or cache_dir()) / _kernel_folder(kernel) / group


def _entries(paths: Iterable[Path]) -> list[CacheEntry]:
    return [e for e in map(read, sorted(paths)) if e is not None]


def _flat(root: Path, kernel: str) -> list[CacheEntry]:
    """The kernel's entries an earlier version wrote flat in root (none once the cache has
    been written to since): listing root costs little, it holds a folder per kernel."""
    return [e for e in _entries(root.glob("*.json")) if e.kernel == kernel]


def of_group(kernel: str, kernel_source: str, backend: str, device: str,
             versions: Mapping[str, str], fixed: Mapping[str, Any] | None = None,
             root: Path | None = None) -> list[CacheEntry]:
    """Every entry of one group (see group_dir), of every problem: all that a nearest-size
    lookup compares, read without reading any other."""
    root = root or cache_dir()
    here = group_dir(kernel, kernel_source, backend, device, versions, fixed, root)
    want = (kernel_source, backend, device, dict(versions), dict(fixed or {}))
    return [e for e in _entries(here.glob("*.json")) + _flat(root, kernel)
            if (e.kernel_source, e.backend, e.device, dict(e.versions), dict(e.fixed)) == want]


def read(path: Path) -> CacheEntry | None:
    """An entry, or None for a damaged or foreign file (a special file, one too large, a
    field of the wrong type or range, a name its contents do not hash to): a cache miss,
    never an error."""
    try:
        doc = read_json(path, ENTRY_LIMIT)
    except OSError:  # a race with a writer's rename, or gone
        return None
    except ReadBackError:
        return None
    if not isinstance(doc, dict):
        return None
    # Fields a later version added are left out (and lost if this one rewrites it).
    known = {k: v for k, v in doc.items() if k in _FIELDS}
    if set(_REQUIRED) - set(known) or not all(check(known[k]) for k, check in
                                              _CHECKS.items() if k in known):
        return None
    entry = CacheEntry(**{**known, "runs": tuple(known.get("runs", ())),
                          "declared": tuple(known.get("declared", ()))})
    return entry if path.stem == entry.key else None


# A cache entry is a few kilobytes; its `runs` grow by one fingerprint a sweep.
ENTRY_LIMIT = 4 * 2**20


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _mapping_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x)
                                                 for k, x in v.items())


def _fixed_value(v: Any) -> bool:
    return scalar(v) or v is None or (isinstance(v, list) and all(map(_fixed_value, v)))


_FIELDS = {f.name for f in fields(CacheEntry)}
_REQUIRED = ("kernel", "kernel_source", "problem", "backend", "device", "config",
             "latency_ms", "fingerprint", "run_dir", "partial", "written_at")
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "kernel": _text, "kernel_source": _text, "backend": _text, "device": _text,
    "fingerprint": _text, "run_dir": _text, "host": _text,
    "problem": _mapping_of(_fixed_value), "fixed": _mapping_of(_fixed_value),
    "config": lambda v: _mapping_of(scalar)(v) and bool(v),
    "versions": _mapping_of(_text),
    "latency_ms": lambda v: finite(v, low=0.0) and v > 0,
    "partial": lambda v: isinstance(v, bool),
    # Seconds since 1970, up to the year 5000: a time strftime can print.
    "written_at": lambda v: finite(v, low=0.0, high=1e11),
    "runs": _texts, "declared": _texts, "sources": _mapping_of(_text),
}


def store(entry: CacheEntry, root: Path | None = None,
          unfit: Callable[[CacheEntry], bool] | None = None) -> tuple[CacheEntry, Path]:
    """Keep the better of entry and the one its key holds (a complete entry replaces one
    whose run directory is gone, or that unfit says cannot answer entry's sweep), with the
    complete sweeps of both (a partial entry's are not counted). Returns the entry the
    cache keeps and its file. Runs that finish together are serialised by a lock."""
    return store_many([entry], root, unfit)[0]


def store_many(entries: Sequence[CacheEntry], root: Path | None = None,
               unfit: Callable[[CacheEntry], bool] | None = None
               ) -> list[tuple[CacheEntry, Path]]:
    """store() for each entry (a run over many problems), under one hold of the lock. The
    files of a batch are made durable together at its end (sync_batch), not by two
    fsyncs each (10,000 problems' entries spent most of a minute in fsyncs): until then a
    crash can leave an entry torn, and a torn entry is read as a miss."""
    root = root or cache_dir()
    batch = len(entries) > 1
    kept_paths: list[tuple[CacheEntry, Path]] = []
    written: list[Path] = []
    touched: set[Path] = set()

    def make(folder: Path) -> None:
        parents = make_dirs(folder)
        if not batch:  # the new folders' names are durable before the entry in them
            fsync_dirs(parents)
        touched.update(parents)

    make(root)
    with _locked(root):
        _move_flat_entries(root)
        for entry in entries:
            path = entry.path(root)
            make(path.parent)
            held = read(path) if path.exists() else None
            kept = _kept(entry, held, unfit)
            if kept != held:
                data = (json.dumps(asdict(kept), indent=2) + "\n").encode()
                write_bytes_atomically(path, data, durable=not batch)
                written.append(path)
                touched.add(path.parent)
            kept_paths.append((kept, path))
        if batch:
            sync_batch(root, written, touched)
    return kept_paths


def _kept(entry: CacheEntry, held: CacheEntry | None,
          unfit: Callable[[CacheEntry], bool] | None) -> CacheEntry:
    """What the cache keeps of entry and the one held under its key."""
    # One that cannot answer entry's sweep is dropped, the sweeps it answered with it:
    # they would be answered with entry's best, found in another space.
    if held is not None and not entry.partial and unfit is not None and unfit(held):
        held = None

    def merged(name: str) -> tuple[str, ...]:
        ours = () if entry.partial else getattr(entry, name)
        return tuple(dict.fromkeys([*(getattr(held, name) if held else ()), *ours]))

    # A complete run's best replaces one whose run directory is gone whatever the
    # latency: an answer must name a run the user can still inspect.
    kept = entry if held is None or entry.better_than(held) or \
        (not entry.partial and held.run_gone) else held
    return replace(kept, runs=merged("runs"), declared=merged("declared"))


def _move_flat_entries(root: Path) -> None:
    """Move the entries an earlier version wrote flat in root into their folders (under
    the cache's lock), keeping the better where both are there. Anything else there (a
    damaged file, a FIFO) is left where it is, as every reader leaves it."""
    for flat in sorted(root.glob("*.json")):
        entry = read(flat)
        if entry is None:
            continue
        path = entry.path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        held = read(path)
        if held is None or entry.better_than(held):
            os.replace(flat, path)
        else:
            flat.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Read, compare and replace as one step among processes (a blocking flock)."""
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def declared_somewhere(kernel: str, declared: str, root: Path | None = None) -> bool:
    """Whether a complete sweep with this declared fingerprint is on record for the
    kernel: worth importing the kernel for, to look its entries up."""
    return any(declared in e.declared for e in of_kernel(kernel, root))


def answered_by_files(kernel: str, declared: str, backend: str, origin: str,
                      file_digest: Callable[[str], str],
                      root: Path | None = None) -> list[CacheEntry]:
    """Complete entries for a sweep with this declared fingerprint on this backend whose
    kernel source files are unchanged (each file's digest, as file_digest gives it, the
    one recorded) and among them the file the kernel's module would be imported from now
    (origin: not another checkout's): the same declared spec over the same source merges
    the same kernel defaults, so these answer it as a lookup after importing the kernel
    would, from files alone."""
    return [e for e in of_kernel(kernel, root)
            if declared in e.declared and e.backend == backend and not e.partial
            and origin in e.sources
            and all(file_digest(p) == d for p, d in e.sources.items())]


def of_kernel(kernel: str, root: Path | None = None) -> list[CacheEntry]:
    """Every cached best for this kernel, of any problem, backend, device and versions."""
    root = root or cache_dir()
    return [e for e in _entries((root / _kernel_folder(kernel)).glob("*/*.json"))
            + _flat(root, kernel) if e.kernel == kernel]


def lookup(kernel: str, kernel_source: str, problem: Mapping[str, Any],
           fixed: Mapping[str, Any] | None = None,
           root: Path | None = None) -> list[CacheEntry]:
    """Every cached best for this kernel, problem and fixed arguments, on any backend,
    device and versions."""
    return lookup_many(kernel, kernel_source, [problem], fixed, root)[0]


def lookup_many(kernel: str, kernel_source: str, problems: Sequence[Mapping[str, Any]],
                fixed: Mapping[str, Any] | None = None,
                root: Path | None = None) -> list[list[CacheEntry]]:
    """lookup() of each problem (a sweep over many), in their order. Each group of the
    kernel's (a backend, device and versions) is learnt from one of its entries, and then
    each problem's entry there is the one file its key names: N problems read about N
    files a group, however many entries the kernel has."""
    root = root or cache_dir()
    fixed = dict(fixed or {})
    asked = {canonical_json(dict(p)): dict(p) for p in problems}
    found: dict[str, list[CacheEntry]] = {form: [] for form in asked}
    for group in _groups(root / _kernel_folder(kernel)):
        if (group.kernel, group.kernel_source, dict(group.fixed)) != \
                (kernel, kernel_source, fixed):
            continue
        folder = group.path(root).parent
        for form, hits in found.items():
            key = entry_key(kernel, kernel_source, asked[form], group.backend,
                            group.device, group.versions, fixed)
            e = read(folder / f"{key}.json")
            if e is not None:
                hits.append(e)
    for e in _flat(root, kernel):  # an earlier version's, until the next write moves them
        form = canonical_json(dict(e.problem))
        if form in found and (e.kernel_source, dict(e.fixed)) == (kernel_source, fixed):
            found[form].append(e)
    return [found[canonical_json(dict(p))] for p in problems]


def _groups(kernel_folder: Path) -> Iterator[CacheEntry]:
    """One entry of each of a kernel's groups (the first readable one): what the group
    holds, as its folder's name is a hash of it."""
    try:
        folders = sorted(d for d in kernel_folder.iterdir() if d.is_dir())
    except OSError:  # no entries of this kernel yet
        return
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            e = read(path)
            if e is not None and e.path(kernel_folder.parent) == path:
                yield e
                break


def answering(entries: list[CacheEntry], devices: Sequence[tuple[str, Mapping[str, str]]]
              ) -> list[CacheEntry]:
    """The entry for each device (by its exact name and the torch and Triton versions it
    runs), or nothing unless every device has one: a run on several devices is answered
    whole or not at all."""
    found = []
    for device, versions in {d: v for d, v in devices}.items():
        matching = [e for e in entries if e.device == device and
                    dict(e.versions) == dict(versions)]
        if not matching:
            return []
        found.append(min(matching, key=lambda e: e.latency_ms))
    return found
