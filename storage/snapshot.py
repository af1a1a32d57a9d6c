"""snapshot.json: the run's state, replaced atomically (best.json is storage/best_file.py's).

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
from storage.best_file import (
    ProblemChoice,
    baseline_intact,
    best_fields,
    device_name,
    finalists_intact,
    problem_choices,
    problem_intact,
)
from storage.readback import ReadBackError, finite, read_json
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

    def problems(self) -> list[ProblemChoice]:
        """by_problem read as best.json's is (each problem checked when the file was)."""
        return problem_choices(self.by_problem)


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

    return snap.state in ("running", "interrupted", "complete", "failed") and \
        isinstance(snap.fingerprint, str) and count(snap.total) and count(snap.done) and \
        isinstance(snap.counts, dict) and all(isinstance(k, str) and count(v)
                                              for k, v in snap.counts.items()) and \
        finite(snap.written_at) and \
        (snap.first_dispatch_at is None or finite(snap.first_dispatch_at)) and \
        finalists_intact(snap.finalists) and isinstance(snap.timeline, dict) and \
        all(isinstance(k, str) and finite(v) for k, v in snap.timeline.items()) and \
        baseline_intact(snap.baseline) and isinstance(snap.sessions, list) and \
        isinstance(snap.by_problem, list) and all(map(problem_intact, snap.by_problem)) and \
        all(isinstance(s, list) and len(s) == 2 and all(map(finite, s)) for s in snap.sessions)


def _best(doc: Any) -> Best:
    """A Best as a file holds it, checked: what it names is handed to users' code."""
    if not isinstance(doc, dict):
        raise TypeError(f"a best of {type(doc).__name__}, not a mapping")
    best = Best(**doc)
    if not best_fields(best.config, best.index, best.latency_ms) or \
            not device_name(best.device):
        raise ValueError("a best of the wrong type or range")
    return best
