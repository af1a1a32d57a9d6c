"""A run's end in a few lines, as the command prints it: its counts, its best on each
device type, where its table is and how to resume it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rich.console import Console

from storage.records import PRUNED
from sweep.console import say
from sweep.numbers import significant
from sweep.results.tally import Tally


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


def print_summary(out: Console, name: str, path: Path, state: str, tally: Tally,
                  elapsed_s: float, resume_options: str = "", most: int | None = None) -> None:
    """most: the trials a search runs at most (see how_many)."""
    counts = " · ".join(f"{k} {v}" for k, v in sorted(tally.counts.items())) or "none"
    done = how_many(tally.done, tally.total, tally.counts.get(PRUNED, 0), most)
    say(out, f"sweep {name}: {state} — {done} in {elapsed_s:.1f} s ({counts})")
    if tally.best:
        partial = "" if state == "complete" else " (partial)"
        # On a cluster of several device types, the best of each (the fastest first).
        bests = sorted(tally.by_device.values(), key=lambda b: (b.latency_ms, b.index)) \
            if len(tally.by_device) > 1 else [tally.best]
        for b in bests:
            say(out, f"  best: #{b.index} {json.dumps(b.config, sort_keys=True)} "
                     f"{significant(b.latency_ms)} ms on {b.device}{partial}")
    else:
        say(out, "  best: none (no trial succeeded)")
    say(out, f"  results: {path}/trials.parquet")
    if state != "complete":
        say(out, f"  resume with: {resume_command(path)}{resume_options}")
