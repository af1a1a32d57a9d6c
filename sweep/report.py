"""What a person reads about a run: the end-of-run summary and `sweep report DIR`."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from sweep import EXIT_OK
from sweep.tally import Tally

if TYPE_CHECKING:
    import pyarrow as pa

# Numbers in an error's text (a max error, a size) would split one cause into many groups.
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def say(console: Console, text: str) -> None:
    """Plain text: no markup, no highlighting, no wrapping (lines are grep-able)."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def report(path: Path, top: int, out: Console) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from sweep.rundir import RunDir
    from sweep.spec import SpecError

    run = RunDir(path)
    if not run.trials.exists():
        raise SpecError(f"{path}: no trials.parquet (resume the run to rebuild it)")
    try:
        table = pq.read_table(run.trials)
        meta = table.schema.metadata or {}
        state = meta.get(b"state", b"?").decode(errors="replace")
        counts = {d["values"]: d["counts"]
                  for d in pc.value_counts(table["status"]).to_pylist()}
        ok = table.filter(pc.equal(table["status"], "ok")).sort_by("latency_ms")
    except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as e:
        raise SpecError(f"{run.trials}: unreadable ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}); "
                        f"resume the run to rebuild it") from None
    say(out, f"{path}: {state}, {table.num_rows} trials · "
             + " · ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for row in ok.slice(0, top).to_pylist():
        say(out, f"  #{row['index']:<6} {row['latency_ms']:.4g} ms "
                 f"[{row['latency_p20_ms']:.4g}, {row['latency_p80_ms']:.4g}]  {row['config']}")
    return EXIT_OK


@dataclass(frozen=True)
class ErrorGroup:
    """Failed trials whose errors have the same cause: a status and a first line that
    differ in numbers alone."""

    status: str
    count: int
    example: str  # the first such trial's first line
    index: int  # that trial's index


def common_errors(table: pa.Table, top: int = 5) -> list[ErrorGroup]:
    """The commonest failures of a trial table (columns index, status, error), commonest
    first (ties: the lower index)."""
    rows = zip(table.column("index").to_pylist(), table.column("status").to_pylist(),
               table.column("error").to_pylist())
    return _group(((i, s, e) for i, s, e in rows if s != "ok"), top)


def _group(failures: Iterable[tuple[int, str, str | None]], top: int) -> list[ErrorGroup]:
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for index, status, error in sorted(failures):
        line = (error or "").strip().splitlines()[0][:200] if (error or "").strip() \
            else "(no error text)"
        groups.setdefault((status, _NUMBER.sub("#", line)), []).append((index, line))
    ranked = sorted(groups.items(), key=lambda g: (-len(g[1]), g[1][0][0]))
    return [ErrorGroup(status, len(members), members[0][1], members[0][0])
            for (status, _), members in ranked[:top]]


def resume_command(path: Path) -> str:
    return f"sweep resume {shlex.quote(str(path))}"


def print_summary(out: Console, name: str, path: Path, state: str, tally: Tally,
                  elapsed_s: float, resume_options: str = "") -> None:
    counts = " · ".join(f"{k} {v}" for k, v in sorted(tally.counts.items())) or "none"
    say(out, f"sweep {name}: {state} — {tally.done} of {tally.total} trials in "
             f"{elapsed_s:.1f} s ({counts})")
    if tally.best:
        partial = "" if state == "complete" else " (partial)"
        # On a cluster of several device types, the best of each (the fastest first).
        bests = sorted(tally.by_device.values(), key=lambda b: (b.latency_ms, b.index)) \
            if len(tally.by_device) > 1 else [tally.best]
        for b in bests:
            say(out, f"  best: #{b.index} {json.dumps(b.config, sort_keys=True)} "
                     f"{b.latency_ms:.4g} ms on {b.device}{partial}")
    else:
        say(out, "  best: none (no trial succeeded)")
    say(out, f"  results: {path}/trials.parquet")
    if state != "complete":
        say(out, f"  resume with: {resume_command(path)}{resume_options}")


