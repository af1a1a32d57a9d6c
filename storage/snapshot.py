"""snapshot.json and best.json: small JSON state files, replaced atomically.

The snapshot carries a SHA-256 of its body, so a file damaged by something other than our
atomic writer (a copy cut short, a disk fault) is recognised and the run rebuilt from the
journal instead of being trusted.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from storage.atomic import write_bytes_atomically
from storage.readback import ReadBackError, finite, printable, read_json, scalar
from storage.records import Best, canonical_json

RunState = Literal["running", "interrupted", "complete", "failed"]


class SnapshotError(Exception):
    """snapshot.json is unreadable or its checksum does not match."""


@dataclass(frozen=True)
class Snapshot:
    state: RunState
    fingerprint: str
    total: int
    done: int
    counts: dict[str, int]
    best: Best | None
    written_at: float = field(default_factory=time.time)
    first_dispatch_at: float | None = None  # this session's first trial handed out
    # The fastest few re-timed side by side, which chose `best` (a complete run's), kept
    # here too so that a lost best.json can be rebuilt as it was.
    finalists: list[dict[str, Any]] = field(default_factory=list)
    # When this session reached each phase (wall clock): where a command's seconds went.
    timeline: dict[str, float] = field(default_factory=dict)
    # The best on each device type the run's records name (one entry on a cluster of one).
    by_device: dict[str, Best] = field(default_factory=dict)
    # torch doing the kernel's job, timed among the finalists on each device type
    # (latency_ms, latency_p20_ms, latency_p80_ms, and "of": the kernel's "baseline", or its
    # validation "reference" where it has no baseline): where the backend runs kernels.
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)
    # [start, last write] of every session that ran this run, this one last: a report
    # tells a worker's idle time within a session from the time between two.
    sessions: list[list[float]] = field(default_factory=list)
    # A sweep over problems: best.json's `by_problem` (each problem's best, bests by
    # device, finalists and baseline), kept to rebuild it.
    by_problem: list[dict[str, Any]] = field(default_factory=list)


def checksum(body: dict[str, Any]) -> str:
    """SHA-256 of a JSON body in canonical form: what a state file carries to prove itself whole."""
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def write_snapshot(path: Path, snapshot: Snapshot) -> None:
    body = asdict(snapshot)
    doc = {"snapshot": body, "sha256": checksum(body)}
    write_bytes_atomically(path, (json.dumps(doc, indent=2) + "\n").encode())


def read_snapshot(path: Path) -> Snapshot:
    try:
        doc = read_json(path)
        body = doc["snapshot"]
        if doc["sha256"] != checksum(body):
            raise SnapshotError(f"{path}: checksum mismatch (file damaged)")
        best = _best(body["best"]) if body["best"] is not None else None
        # A snapshot from before `by_device` existed: its best was its one device's.
        by_device = {d: _best(b) for d, b in body["by_device"].items()} \
            if "by_device" in body else {best.device: best} if best else {}
        snap = Snapshot(**{**body, "best": best, "by_device": by_device})
    except SnapshotError:
        raise
    except ReadBackError as e:
        raise SnapshotError(f"{path}: unreadable ({e.why})") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SnapshotError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if not _snapshot_intact(snap):
        raise SnapshotError(f"{path}: unreadable (a value of the wrong type or range)")
    return snap


def _snapshot_intact(snap: Snapshot) -> bool:
    """Each field of the type write_snapshot gives it: the checksum proves the file whole,
    not that this tool wrote it."""
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    def of_dicts(v: Any) -> bool:
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, dict)
                                           for k, x in v.items())

    return snap.state in ("running", "interrupted", "complete", "failed") and \
        isinstance(snap.fingerprint, str) and count(snap.total) and count(snap.done) and \
        isinstance(snap.counts, dict) and all(isinstance(k, str) and count(v)
                                              for k, v in snap.counts.items()) and \
        finite(snap.written_at) and \
        (snap.first_dispatch_at is None or finite(snap.first_dispatch_at)) and \
        isinstance(snap.finalists, list) and all(isinstance(f, dict) for f in snap.finalists) \
        and isinstance(snap.timeline, dict) and all(isinstance(k, str) and finite(v)
                                                    for k, v in snap.timeline.items()) \
        and of_dicts(snap.baseline) and isinstance(snap.sessions, list) and \
        isinstance(snap.by_problem, list) and all(map(_problem_intact, snap.by_problem)) and \
        all(isinstance(s, list) and len(s) == 2 and all(map(finite, s)) for s in snap.sessions)


def _best(doc: Any) -> Best:
    """A Best as a file holds it, checked: what it names is handed to users' code."""
    if not isinstance(doc, dict):
        raise TypeError(f"a best of {type(doc).__name__}, not a mapping")
    best = Best(**doc)
    if not _best_fields(best.config, best.index, best.latency_ms) or \
            not _device_name(best.device):
        raise ValueError("a best of the wrong type or range")
    return best


def _device_name(name: Any) -> bool:
    """A device name as the table spells it: printable text, never a terminal's escape."""
    return isinstance(name, str) and printable(name, len(name)) == name


def _best_fields(config: Any, index: Any, latency_ms: Any) -> bool:
    return isinstance(config, dict) and all(isinstance(k, str) and scalar(v)
                                            for k, v in config.items()) and \
        isinstance(index, int) and not isinstance(index, bool) and index >= 0 and \
        finite(latency_ms, low=0.0)


def read_best(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """best.json as written for this run, or None if it is missing, damaged or another
    run's."""
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        return None
    # Files written before the newer keys existed are intact too.
    if not isinstance(doc, dict) or doc.get("fingerprint") != fingerprint or \
            not set(BEST_KEYS) - set(NEWER_BEST_KEYS) <= set(doc) <= set(BEST_KEYS):
        return None
    return doc if _best_doc_intact(doc) else None


def _best_doc_intact(doc: dict[str, Any]) -> bool:
    """Each key of the type write_best gives it. No best is all four of config, index,
    latency and device null (and no device's best): one null among values is damage."""
    head = [doc[k] for k in ("config", "index", "latency_ms", "device")]
    by_device = doc.get("by_device", {})
    if not isinstance(doc["partial"], bool) or not isinstance(doc["finalists"], list) or \
            not all(isinstance(f, dict) for f in doc["finalists"]) or \
            not isinstance(by_device, dict) or not isinstance(doc.get("baseline", {}), dict):
        return False
    if not isinstance(doc.get("by_problem", []), list) or \
            not all(map(_problem_intact, doc.get("by_problem", []))):
        return False
    if all(v is None for v in head):
        return not by_device
    return _head_intact(head, by_device, "by_device" not in doc)


def _head_intact(head: list[Any], by_device: Any, older: bool = False) -> bool:
    """config, index, latency_ms and device of a best, and its bests by device."""
    has_devices = bool(by_device) or older
    return isinstance(by_device, dict) and _best_fields(*head[:3]) and \
        _device_name(head[3]) and has_devices and \
        all(_device_name(d) and isinstance(b, dict) and
            _best_fields(b.get("config"), b.get("index"), b.get("latency_ms"))
            for d, b in by_device.items())


PROBLEM_KEYS = ("problem", "first_index", "configs", "config", "index", "latency_ms",
                "device", "by_device", "finalists", "baseline")


def _problem_intact(doc: Any) -> bool:
    """One problem of best.json's by_problem, as write_best gives it."""
    if not isinstance(doc, dict) or set(doc) != set(PROBLEM_KEYS) or \
            not isinstance(doc["problem"], dict) or \
            not all(isinstance(k, str) and scalar(v) for k, v in doc["problem"].items()) or \
            not all(isinstance(doc[k], int) and not isinstance(doc[k], bool) and doc[k] >= 0
                    for k in ("first_index", "configs")) or \
            not isinstance(doc["finalists"], list) or \
            not all(isinstance(f, dict) for f in doc["finalists"]) or \
            not isinstance(doc["baseline"], dict):
        return False
    head = [doc[k] for k in ("config", "index", "latency_ms", "device")]
    if all(v is None for v in head):
        return doc["by_device"] == {}
    return _head_intact(head, doc["by_device"])


BEST_KEYS = ("config", "index", "latency_ms", "device", "partial", "fingerprint", "finalists",
             "by_device", "baseline", "by_problem")
NEWER_BEST_KEYS = ("by_device", "baseline", "by_problem")


def write_best(path: Path, best: Best | None, *, fingerprint: str, partial: bool,
               finalists: list[dict[str, Any]] | None = None,
               by_device: dict[str, Best] | None = None,
               baseline: dict[str, dict[str, Any]] | None = None,
               by_problem: list[dict[str, Any]] | None = None) -> None:
    """finalists: the fastest few re-timed side by side, which chose `best` (may be empty;
    each names the device type it was re-timed on). by_device: the best of each device
    type; `best` is the fastest of them. baseline: torch doing the same job, timed among
    the finalists, by device type (see Snapshot.baseline). by_problem: in a sweep over
    problems, each problem's (problem_doc); `best` and the rest are then the first's."""
    doc = {
        "config": best.config if best else None,
        "index": best.index if best else None,
        "latency_ms": best.latency_ms if best else None,
        "device": best.device if best else None,
        "partial": partial,
        "fingerprint": fingerprint,
        "finalists": finalists or [],
        "by_device": {d: {"config": b.config, "index": b.index, "latency_ms": b.latency_ms}
                      for d, b in sorted((by_device or {}).items())},
        "baseline": dict(sorted((baseline or {}).items())),
    }
    if by_problem:
        doc["by_problem"] = by_problem
    write_bytes_atomically(path, (json.dumps(doc, indent=2) + "\n").encode())


def problem_doc(problem: dict[str, Any], first_index: int, configs: int, best: Best | None,
                by_device: dict[str, Best], finalists: list[dict[str, Any]],
                baseline: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One problem of best.json's by_problem: the problem (every key, the kernel's defaults
    merged in), its configs' index range, its best as best.json's head holds one."""
    return {
        "problem": problem, "first_index": first_index, "configs": configs,
        "config": best.config if best else None, "index": best.index if best else None,
        "latency_ms": best.latency_ms if best else None,
        "device": best.device if best else None,
        "by_device": {d: {"config": b.config, "index": b.index, "latency_ms": b.latency_ms}
                      for d, b in sorted(by_device.items())},
        "finalists": finalists, "baseline": dict(sorted(baseline.items())),
    }
