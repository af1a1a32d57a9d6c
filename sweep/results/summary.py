"""A run's end in a few lines, as the command prints it: its counts, its best on each
device type, where its table is and how to resume it."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from rich.console import Console

from storage.records import PRUNED
from sweep.console import say, say_line
from sweep.numbers import significant
from sweep.results.errors import common_errors
from sweep.results.tally import Tally
from sweep.spec import Spec


def problem_labels(spec: Spec) -> list[str]:
    """Each problem of a sweep over problems by the keys that vary (`M=16, N=4096`)."""
    keys = spec.problem_keys
    return [", ".join(f"{k}={p[k]}" for k in keys) for p in spec.problems]


def _ran(tally: Tally) -> int:
    """Trials that ran (a search's pruned configs never did)."""
    return tally.done - tally.counts.get(PRUNED, 0)


def _say_best(out: Console, tally: Tally, lead: str, partial: str) -> None:
    if tally.best is None:
        say_line(out, f"{lead}none (no trial {'succeeded' if _ran(tally) else 'ran'})")
        return
    # On a cluster of several device types, the best of each (the fastest first).
    bests = sorted(tally.by_device.values(), key=lambda b: (b.latency_ms, b.index)) \
        if len(tally.by_device) > 1 else [tally.best]
    for b in bests:
        say_line(out, f"{lead}#{b.index} {json.dumps(b.config, sort_keys=True)} "
                 f"{significant(b.latency_ms)} ms on {b.device}{partial}")


def resume_command(path: Path) -> str:
    return f"sweep resume {shlex.quote(str(path))}"


def how_many(done: int, total: int, pruned: int, most: int | None = None) -> str:
    """How much of the space a run has done; a search's pruned configs are not trials.
    most: the trials a search still going runs at most (its budget)."""
    if pruned:
        return f"{done - pruned} of {total} configs run, {pruned} pruned by the search"
    if most is not None and most < total:
        return f"{done} of at most {most} trials (a search of {total} configs)"
    return f"{done} of {total} trials"


@dataclass(frozen=True)
class Summary:
    """What a session's last lines say: the run (its name and directory), how it ended,
    its tally, this session's seconds, and how to go on. most: the trials a search runs
    at most (see how_many). problems: in a sweep over problems, each one's label (`M=16`):
    a best line each. done_before: the trials the run held when this session began: the
    counts are the run's, the time this session's."""

    name: str
    path: Path
    state: str
    tally: Tally
    elapsed_s: float
    resume_options: str = ""
    most: int | None = None
    problems: Sequence[str] = ()
    done_before: int = 0


def print_summary(out: Console, summary: Summary) -> None:
    name, path, state, tally = summary.name, summary.path, summary.state, summary.tally
    elapsed_s, done_before, most = summary.elapsed_s, summary.done_before, summary.most
    counts = " · ".join(f"{k} {v}" for k, v in sorted(tally.counts.items())) or "none"
    pruned = tally.counts.get(PRUNED, 0)
    done = how_many(tally.done, tally.total, pruned, most)
    if done_before:
        this = max(tally.done - done_before, 0)
        done += f"{'' if pruned else ' done'} ({this} in this session, {elapsed_s:.1f} s)"
    else:
        done += f" in {elapsed_s:.1f} s"
    say_line(out, f"sweep {name}: {state} — {done} ({counts})")
    partial = "" if state == "complete" else " (partial)"
    if not tally.problems:
        _say_best(out, tally, "  best: ", partial)
    for label, mine in zip(summary.problems, tally.problems):
        _say_best(out, mine, f"  best for {label}: ", partial)
    say_line(out, f"  results: {path}/trials.parquet")
    if _ran(tally):
        quoted = shlex.quote(str(path))
        say_line(out, f"  next: sweep report {quoted} (the fastest, the failures), "
                 f"sweep best {quoted} (the best as a triton.Config)")
    if state != "complete":
        say_line(out, f"  resume with: {resume_command(path)}{summary.resume_options}")


def print_errors(out: Console, records: pa.Table, top: int = 5) -> None:
    """Why nothing worked: the commonest errors, grouped, so the user need not open the
    table to find out."""
    groups = common_errors(records, top)
    say(out, "  no config succeeded; the commonest errors:")
    for group in groups:
        say(out, f"    {group.count:>6} × {group.status}: {group.example} (e.g. #{group.index})")
