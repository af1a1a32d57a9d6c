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
from storage.records import canonical_json

RunState = Literal["running", "interrupted", "complete", "failed"]


class SnapshotError(Exception):
    """snapshot.json is unreadable or its checksum does not match."""


@dataclass(frozen=True)
class Best:
    index: int
    config: dict[str, Any]
    latency_ms: float
    device: str


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


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def write_snapshot(path: Path, snapshot: Snapshot) -> None:
    body = asdict(snapshot)
    doc = {"snapshot": body, "sha256": _checksum(body)}
    write_bytes_atomically(path, (json.dumps(doc, indent=2) + "\n").encode())


def read_snapshot(path: Path) -> Snapshot:
    try:
        doc = json.loads(path.read_text())
        body = doc["snapshot"]
        if doc["sha256"] != _checksum(body):
            raise SnapshotError(f"{path}: checksum mismatch (file damaged)")
        best = Best(**body["best"]) if body["best"] is not None else None
        # A snapshot from before `by_device` existed: its best was its one device's.
        by_device = {d: Best(**b) for d, b in body["by_device"].items()} \
            if "by_device" in body else {best.device: best} if best else {}
        return Snapshot(**{**body, "best": best, "by_device": by_device})
    except SnapshotError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SnapshotError(f"{path}: unreadable ({type(e).__name__}: {e})") from e


def read_best(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """best.json as written for this run, or None if it is missing, damaged or another
    run's."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    # Files written before the newer keys existed are intact too.
    if not isinstance(doc, dict) or doc.get("fingerprint") != fingerprint or \
            not set(BEST_KEYS) - set(NEWER_BEST_KEYS) <= set(doc) <= set(BEST_KEYS):
        return None
    return doc


BEST_KEYS = ("config", "index", "latency_ms", "device", "partial", "fingerprint", "finalists",
             "by_device", "baseline")
NEWER_BEST_KEYS = ("by_device", "baseline")


def write_best(path: Path, best: Best | None, *, fingerprint: str, partial: bool,
               finalists: list[dict[str, Any]] | None = None,
               by_device: dict[str, Best] | None = None,
               baseline: dict[str, dict[str, Any]] | None = None) -> None:
    """finalists: the fastest few re-timed side by side, which chose `best` (may be empty;
    each names the device type it was re-timed on). by_device: the best of each device
    type; `best` is the fastest of them. baseline: torch doing the same job, timed among
    the finalists, by device type (see Snapshot.baseline)."""
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
    write_bytes_atomically(path, (json.dumps(doc, indent=2) + "\n").encode())
