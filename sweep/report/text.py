"""What a person reads about a run in a terminal: the end-of-run summary and `sweep report
DIR`'s text. The HTML page borrows its phrases, so both say a thing the same way."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from storage.records import PRUNED
from sweep.numbers import ratio, significant
from sweep.report.rates import rate_column, rates
from sweep.results.summary import how_many

if TYPE_CHECKING:
    from sweep.report.analysis import Analysis, Baseline, Ranked
    from sweep.report.timeline import WorkerUse


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


