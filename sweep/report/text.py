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

from storage.records import PRUNED
from sweep import EXIT_OK
from sweep.report.numbers import amount, ratio, scale, significant
from sweep.results.tally import Tally

if TYPE_CHECKING:
    import pyarrow as pa

    from sweep.report.analysis import Analysis, Baseline, Ranked, WorkerUse

# Numbers in an error's text (a max error, a size) would split one cause into many groups.
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def say(console: Console, text: str) -> None:
    """Plain text: no markup, no highlighting, no wrapping (lines are grep-able)."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def report(path: Path, top: int, out: Console, *, as_json: bool = False,
           html: Path | None = None, plot: Path | None = None) -> int:
    """`sweep report DIR`: the text report (or its JSON), and the HTML report and PNGs
    where asked. Every figure comes from sweep.report.analysis."""
    from sweep.report.analysis import analyse
    from sweep.spec import SpecError

    if top < 0:
        raise SpecError(f"--top: expected 0 or more, got {top}")
    analysis = analyse(path)
    # The files first: a reader that closes stdout early (`| head`) must not lose them.
    written = []
    if html is not None:
        from sweep.report.html import write_html

        write_html(analysis, html)
        written.append(f"html report: {html}")
    if plot is not None:
        from sweep.report.plots import write_plots

        written += [f"plot: {p}" for p in write_plots(analysis, plot)]
    if as_json:
        say(out, json.dumps(analysis.summary(top), indent=2, default=str))
    else:
        for line in text_report(analysis, top):
            say(out, line)
    # With --json, where the files went goes to stderr: stdout stays one JSON document.
    tell = Console(stderr=True) if as_json else out
    for line in written:
        say(tell, line)
    return EXIT_OK


def text_report(a: Analysis, top: int) -> list[str]:
    lines = [f"{a.path}: {a.state} · {a.name} ({a.kernel} on {', '.join(a.devices) or '?'})"
             f" · {how_many(a.done, a.total, a.counts.get(PRUNED, 0))} · "
             + (" · ".join(f"{k} {v}" for k, v in a.counts.items()) or "none")]
    winner = a.chosen
    if winner is not None:
        partial = " (partial: not a complete run's settled pick)" if a.partial else ""
        lines.append(f"winner: #{winner.index} {json.dumps(winner.config, sort_keys=True)} "
                     f"{_latency(winner)}{_throughput(winner)}{partial}")
    elif a.ranked and a.state == "complete":
        lines.append(f"winner: best.json and snapshot.json missing or damaged (sweep resume "
                     f"{a.path} rebuilds them)")
    elif a.ranked:
        lines.append("winner: none recorded yet")
    else:
        lines.append("winner: none (no trial succeeded)")
    for b in a.baseline:
        lines.append(f"{baseline_name(b)} on {b.device}: {significant(b.latency_ms)} ms "
                     f"[{significant(b.latency_p20_ms)}–{significant(b.latency_p80_ms)}]; "
                     f"the best config "
                     f"{speedup_text(b.speedup)}{baseline_note(b)}")
    if a.ranked and top > 0:
        unit, rates = rate_column(a, a.top(top))
        lines.append(f"top {min(top, len(a.ranked))} of {len(a.ranked)} that worked "
                     "(★ the winner; finalists by their side-by-side re-timing, then the "
                     "rest by the sweep's one pass):")
        lines.append(f"  {'rank':>6} {'index':>6}  {'re-timed ms [p20–p80]':<26} "
                     f"{'one pass ms [p20–p80]':<26} {unit:<8} config")
        for r, rate in zip(a.top(top), rates):
            retimed = _spread(r.retimed_ms, r.retimed_p20_ms, r.retimed_p80_ms) \
                if r.retimed_ms is not None else "—"
            rank = f"{'★ ' if r.winner else ''}{r.rank}"
            lines.append(f"  {rank:>6} {'#' + str(r.index):>6}  {retimed:<26} "
                         f"{_spread(r.latency_ms, r.latency_p20_ms, r.latency_p80_ms):<26} "
                         f"{rate:<8} {json.dumps(r.config, sort_keys=True)}")
    failed = sum(g.count for g in a.errors)
    if a.errors:
        lines.append(f"failures ({failed}, grouped by cause, one example each):")
        lines += [f"  {g.status} ×{g.count}  e.g. #{g.index}: {g.example}" for g in a.errors]
    varied = [e for e in a.effects if len(e.values) > 1]
    if varied:
        lines.append("parameters (per value: trials that worked of those run · median / "
                     "best ms of the one pass):")
        width = max(len(e.parameter) for e in varied)
        for e in varied:
            cells = [f"{json.dumps(v.value)}: {v.ok}/{v.trials}"
                     + (f" · {significant(v.median_ms)} / {significant(v.best_ms)}"
                        if v.median_ms is not None and v.best_ms is not None else "")
                     for v in e.values]
            lines.append(f"  {e.parameter:<{width}}  " + "   ".join(cells))
    if a.workers:
        lines.append("workers (busy: share of the time from a worker's first trial to its "
                     "last spent running trials; the rest it waited for compiles or work):")
        lines += [f"  {w.worker} on {w.device}: {worker_use(w)}" for w in a.workers]
    return lines


def worker_use(w: WorkerUse) -> str:
    started = f"; first trial {w.starting_s:.1f} s after its session began" \
        if w.starting_s is not None else ""
    return (f"{w.trials} trials, busy {w.busy_fraction:.0%}, waited {w.waiting_s:.1f} s"
            f"{started}")


def _spread(median: float | None, p20: float | None, p80: float | None) -> str:
    if median is None:
        return "—"
    return f"{significant(median)} [{_ms(p20)}–{_ms(p80)}]"


def _ms(value: float | None) -> str:
    return "—" if value is None else significant(value)


def _latency(r: Ranked) -> str:
    if r.retimed_ms is not None:
        return (f"{_spread(r.retimed_ms, r.retimed_p20_ms, r.retimed_p80_ms)} ms re-timed "
                f"side by side (one pass: {significant(r.latency_ms)} ms) on {r.device}")
    return f"{_spread(r.latency_ms, r.latency_p20_ms, r.latency_p80_ms)} ms on {r.device}"


def _throughput(r: Ranked) -> str:
    parts = rates(r)
    return " · " + " · ".join(parts) if parts else ""


def rates(r: Ranked) -> list[str]:
    """A trial's throughput, each in the unit that reads best: 16.2 MFLOP/s, 378 kB/s."""
    return ([amount(r.tflops * 1e12, "FLOP/s")] if r.tflops is not None else []) + \
        ([amount(r.gbps * 1e9, "B/s")] if r.gbps is not None else [])


# The rate a table's column shows: (the trial's field, its unit, the unit's size in the
# field's unit), FLOP/s where the kernel gives its flops, else B/s.
RATE_FIELDS = {"flops": ("tflops", "FLOP/s", 1e12), "bytes_moved": ("gbps", "B/s", 1e9)}


def rate_field(a: Analysis) -> tuple[str, str, float] | None:
    return next((RATE_FIELDS[k] for k in RATE_FIELDS if k in a.work), None)


def rate_column(a: Analysis, rows: Iterable[Ranked]) -> tuple[str, list[str]]:
    """A table's rate column: its heading, the one unit that puts the column's largest
    value between 1 and 1000 (so values compare), and each row's cell in it."""
    rows = list(rows)
    field = rate_field(a)
    if field is None:
        return "", ["" for _ in rows]
    name, unit, size = field
    values = [getattr(r, name) for r in rows]
    heading, factor = scale([v * size for v in values if v is not None], unit)
    return heading, ["" if v is None else significant(v * size * factor, 3) for v in values]


def speedup_text(speedup: float) -> str:
    """torch's time over the best config's, in words."""
    if abs(speedup - 1) < 0.005:
        return "matches it (within 0.5%)"
    if speedup > 1:
        return f"is {ratio(speedup)}× faster"
    return f"is {ratio(1 / speedup)}× slower"


def baseline_name(b: Baseline) -> str:
    return "torch baseline" if b.of == "baseline" else "torch reference"


def baseline_note(b: Baseline) -> str:
    """What a reader must know before comparing with torch."""
    notes = []
    if b.of != "baseline":
        notes.append("the kernel has no baseline: its validation reference was timed, which "
                     "may compute at a higher precision")
    if b.device == "cpu-interpreter":
        notes.append("Triton interpreted on the CPU against torch compiled: not a speed "
                     "comparison")
    return f" ({'; '.join(notes)})" if notes else ""


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
    return _group(((i, s, e) for i, s, e in rows if s not in ("ok", PRUNED)), top)


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


