"""best.json: a run's answer, read and written here only, into typed records.

Its head is the run's best (in a sweep over problems, the first problem's) with each
device type's best, the finalists re-timed side by side that chose it, and torch's
baseline; `by_problem` holds each problem's as one more of the same. Files written
before `by_device`, `baseline` or `by_problem` existed read as if each were empty (a head
without `by_device` was its one device's best). A file damaged or of another run reads
as None, never as half a record: what it names is handed to users' code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.atomic import write_bytes_atomically
from storage.readback import finite, printable, read_json, scalar
from storage.records import Best

BEST_KEYS = ("config", "index", "latency_ms", "device", "partial", "fingerprint", "finalists",
             "by_device", "baseline", "by_problem")
NEWER_BEST_KEYS = ("by_device", "baseline", "by_problem")
PROBLEM_KEYS = ("problem", "first_index", "configs", "config", "index", "latency_ms",
                "device", "by_device", "finalists", "baseline")


def raced_through(rounds: Sequence[float | None]) -> list[bool]:
    """Which finalists were timed in every round their race ran (a finalist's `rounds`;
    None, in a file from before the race, ran them all). One that sat out the later rounds
    was timed in none of their conditions: its median is no match for the others', so it
    is neither picked nor ranked among them."""
    most = max((n for n in rounds if n is not None), default=0)
    return [n is None or n >= most for n in rounds]


@dataclass(frozen=True)
class Choice:
    """What chose a best, the run's or one problem's: the best (None where no config
    succeeded), each device type's, the finalists re-timed side by side (each names the
    device type it was re-timed on) and torch's baseline by device type."""

    best: Best | None
    by_device: dict[str, Best] = field(default_factory=dict)
    finalists: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProblemChoice:
    """One problem of a sweep over problems: the problem (every key, the kernel's
    defaults merged in), its configs' index range, and what chose its best."""

    problem: dict[str, Any]
    first_index: int
    configs: int
    choice: Choice


@dataclass(frozen=True)
class BestFile:
    fingerprint: str
    partial: bool  # the run stopped before every config ran, or before the re-timing
    choice: Choice  # the run's; in a sweep over problems, the first problem's
    by_problem: list[ProblemChoice] = field(default_factory=list)


def read_best(path: Path, fingerprint: str) -> BestFile | None:
    """best.json as written for this run, or None if it is missing, damaged or another
    run's."""
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        return None
    # Files written before the newer keys existed are intact too.
    if not isinstance(doc, dict) or doc.get("fingerprint") != fingerprint or \
            not set(BEST_KEYS) - set(NEWER_BEST_KEYS) <= set(doc) <= set(BEST_KEYS) or \
            not _best_doc_intact(doc):
        return None
    return BestFile(fingerprint, doc["partial"], _choice(doc),
                    problem_choices(doc.get("by_problem", [])))


def problem_choices(docs: list[dict[str, Any]]) -> list[ProblemChoice]:
    """by_problem as best.json and the snapshot hold it (each checked by problem_intact)."""
    return [ProblemChoice(dict(p["problem"]), p["first_index"], p["configs"], _choice(p))
            for p in docs]


def _choice(doc: dict[str, Any]) -> Choice:
    best = None if doc["config"] is None else \
        Best(doc["index"], dict(doc["config"]), doc["latency_ms"], doc["device"])
    by_device = {d: Best(b["index"], dict(b["config"]), b["latency_ms"], d)
                 for d, b in (doc.get("by_device") or {}).items()}
    if best is not None and "by_device" not in doc:  # written before by_device existed
        by_device = {best.device: best}
    return Choice(best, by_device, list(doc["finalists"]), dict(doc.get("baseline") or {}))


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


def _best_doc_intact(doc: dict[str, Any]) -> bool:
    """Each key of the type write_best gives it. No best is all four of config, index,
    latency and device null (and no device's best): one null among values is damage."""
    head = [doc[k] for k in ("config", "index", "latency_ms", "device")]
    by_device = doc.get("by_device", {})
    if not isinstance(doc["partial"], bool) or not finalists_intact(doc["finalists"]) or \
            not isinstance(by_device, dict) or not baseline_intact(doc.get("baseline", {})):
        return False
    if not isinstance(doc.get("by_problem", []), list) or \
            not all(map(problem_intact, doc.get("by_problem", []))):
        return False
    if all(v is None for v in head):
        return not by_device
    return _head_intact(head, by_device, "by_device" not in doc)


def _head_intact(head: list[Any], by_device: Any, older: bool = False) -> bool:
    """config, index, latency_ms and device of a best, and its bests by device."""
    has_devices = bool(by_device) or older
    return isinstance(by_device, dict) and best_fields(*head[:3]) and \
        device_name(head[3]) and has_devices and \
        all(device_name(d) and isinstance(b, dict) and
            best_fields(b.get("config"), b.get("index"), b.get("latency_ms"))
            for d, b in by_device.items())


def problem_intact(doc: Any) -> bool:
    """One problem of by_problem, as problem_doc gives it."""
    if not isinstance(doc, dict) or set(doc) != set(PROBLEM_KEYS) or \
            not isinstance(doc["problem"], dict) or \
            not all(isinstance(k, str) and scalar(v) for k, v in doc["problem"].items()) or \
            not all(isinstance(doc[k], int) and not isinstance(doc[k], bool) and doc[k] >= 0
                    for k in ("first_index", "configs")) or \
            not finalists_intact(doc["finalists"]) or not baseline_intact(doc["baseline"]):
        return False
    head = [doc[k] for k in ("config", "index", "latency_ms", "device")]
    if all(v is None for v in head):
        return doc["by_device"] == {}
    return _head_intact(head, doc["by_device"])


TIMING_KEYS = ("latency_ms", "latency_p20_ms", "latency_p80_ms")


def finalists_intact(finalists: Any) -> bool:
    """Each finalist names its index, and its re-timing's median with p20/p80 (one not
    re-timed, on the interpreter, its one-pass latency)."""
    return isinstance(finalists, list) and all(
        isinstance(f, dict) and isinstance(f.get("index"), int) and f["index"] >= 0 and
        all(finite(f.get(k), low=0.0)
            for k in (("latency_ms",) if f.get("retimed") is False else TIMING_KEYS))
        for f in finalists)


def baseline_intact(baseline: Any) -> bool:
    """torch's timing on each device type: its median with p20/p80, and what it ran."""
    return isinstance(baseline, dict) and all(
        isinstance(d, str) and isinstance(t, dict) and
        all(finite(t.get(k), low=0.0) for k in TIMING_KEYS) and
        isinstance(t.get("of", ""), str) for d, t in baseline.items())


def device_name(name: Any) -> bool:
    """A device name as the table spells it: printable text, never a terminal's escape."""
    return isinstance(name, str) and printable(name, len(name)) == name


def best_fields(config: Any, index: Any, latency_ms: Any) -> bool:
    return isinstance(config, dict) and all(isinstance(k, str) and scalar(v)
                                            for k, v in config.items()) and \
        isinstance(index, int) and not isinstance(index, bool) and index >= 0 and \
        finite(latency_ms, low=0.0)
