"""What a person reads about a run in a terminal: the end-of-run summary and `sweep report
DIR`'s text. The HTML page borrows its phrases, so both say a thing the same way."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from storage.records import PRUNED
from sweep.console import printable
from sweep.numbers import ratio, significant
from sweep.report.rates import rate_column, rates
from sweep.results.summary import how_many

if TYPE_CHECKING:
    from sweep.report.analysis import Analysis
    from sweep.report.ranking import Baseline, Effect, Problem, Ranked
    from sweep.report.timeline import WorkerUse


def text_report(a: Analysis, top: int) -> list[str]:
    lines = [f"{a.path}: {a.state} · {a.name} ({a.kernel} on {', '.join(a.devices) or '?'})"
             f" · {how_many(a.done, a.total, a.counts.get(PRUNED, 0))} · "
             + (" · ".join(f"{k} {v}" for k, v in a.counts.items()) or "none")]
    if a.problems:
        lines += problem_lines(a, top)
    else:
        lines += _winner_lines(a, top)
    failed = sum(g.count for g in a.errors)
    if a.errors:
        where = _problem_of_index(a)
        lines.append(f"failures ({failed}, grouped by cause, one example each):")
        lines += [f"  {g.status} ×{g.count}  e.g. #{g.index}{where.get(g.index, '')}: "
                  f"{g.example}" for g in a.errors]
    if a.problems:
        lines += problem_effects(a)
    else:
        lines += _effect_lines(a.effects)
    if a.workers:
        lines.append("workers (busy: share of the time from a worker's first trial to its "
                     "last spent running trials; the rest it waited for compiles or work):")
        lines += [f"  {w.worker} on {w.device}: {worker_use(w)}" for w in a.workers]
    return lines


# Why a run on Triton's interpreter has no re-timed column (sweep/run/finish.py).
NOT_RETIMED = "not re-timed under the interpreter, whose timings say nothing of a GPU's"


def ranked_by(a: Analysis) -> str:
    """What orders a run's ranking, as every view says it."""
    if not a.retimed:
        return f"by the sweep's one pass, {NOT_RETIMED}"
    return "finalists by their side-by-side re-timing, then the rest by the sweep's one pass"


def chosen_by(a: Analysis) -> str:
    """What chose each problem's winner, as every view says it."""
    return "its finalists' side-by-side re-timing" if a.retimed else \
        f"the sweep's one pass, {NOT_RETIMED}"


def _winner_lines(a: Analysis, top: int) -> list[str]:
    """A sweep of one problem's winner, torch's time beside it and its top `top`."""
    lines = []
    winner = a.chosen
    if winner is not None:
        partial = " (partial: not a complete run's settled pick)" if a.partial else ""
        how = "" if a.retimed else f" ({NOT_RETIMED})"
        lines.append(f"winner: #{winner.index} {json.dumps(winner.config, sort_keys=True)} "
                     f"{_latency(winner)}{_throughput(winner)}{how}{partial}")
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
                     f"(★ the winner; {ranked_by(a)}):")
        retimed_head = f"{'re-timed ms [p20–p80]':<26} " if a.retimed else ""
        lines.append(f"  {'rank':>6} {'index':>6}  {retimed_head}"
                     f"{'one pass ms [p20–p80]':<26} {unit:<8} config")
        for r, rate in zip(a.top(top), rates):
            retimed = "".join(f"{c:<26} " for c in _retimed_cell(a, r))
            rank = f"{'★ ' if r.winner else ''}{r.rank}"
            lines.append(f"  {rank:>6} {'#' + str(r.index):>6}  {retimed}"
                         f"{_spread(r.latency_ms, r.latency_p20_ms, r.latency_p80_ms):<26} "
                         f"{rate:<8} {json.dumps(r.config, sort_keys=True)}")
    return lines


def _retimed_cell(a: Analysis, r: Ranked | None) -> list[str]:
    """A table's re-timed column: none where nothing was re-timed (the interpreter)."""
    if not a.retimed:
        return []
    if r is None or r.retimed_ms is None:
        return ["—"]
    return [_spread(r.retimed_ms, r.retimed_p20_ms, r.retimed_p80_ms)]


def _effect_lines(effects: list[Effect]) -> list[str]:
    varied = [e for e in effects if len(e.values) > 1]
    if not varied:
        return []
    lines = ["parameters (per value: trials that worked of those run · median / "
             "best ms of the one pass):"]
    width = max(len(e.parameter) for e in varied)
    lines += [f"  {e.parameter:<{width}}  " + effect_cells(e) for e in varied]
    return lines


def effect_cells(e: Effect) -> str:
    """A parameter's values, each with its trials that worked and their latencies."""
    return "   ".join(f"{json.dumps(v.value)}: {v.ok}/{v.trials}"
                       + (f" · {significant(v.median_ms)} / {significant(v.best_ms)}"
                          if v.median_ms is not None and v.best_ms is not None else "")
                       for v in e.values)


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


# --- a sweep over problems ----------------------------------------------------------------

def problem_lines(a: Analysis, top: int) -> list[str]:
    """A sweep over problems: a row per problem (its trials, its winner re-timed among its
    finalists, torch's time on the winner's device), which winning values differ by
    problem, and each problem's top `top`."""
    partial = "; partial: not a complete run's settled picks" if a.partial else ""
    no_rate = "; no throughput: the table's work per launch is the base problem's" \
        if a.spec.get("work") else ""
    lines = [f"problems ({len(a.problems)}, by {', '.join(a.problem_keys)}; each one's "
             f"winner by {chosen_by(a)}{partial}{no_rate}):"]
    torch = any(p.baseline for p in a.problems)
    heads = ["problem", "worked", "winner", *(["re-timed ms [p20–p80]"] if a.retimed else []),
             "one pass ms", *(["finalists"] if a.retimed else []),
             *(["torch ms", "vs torch"] if torch else []), "device", "config"]
    rows, notes = [], {}
    for p in a.problems:
        w = p.chosen
        b = next((b for b in p.baseline if w is not None and b.device == w.device), None)
        if b is not None:
            notes[baseline_note(b)] = baseline_name(b)
        rows.append([p.label, problem_trials(p), f"#{w.index}" if w else "—",
                     *_retimed_cell(a, w), significant(w.latency_ms) if w else "—",
                     *([str(p.finalists)] if a.retimed else []),
                     *([_ms(b.latency_ms) if b else "—", versus(b.speedup) if b else "—"]
                       if torch else []),
                     w.device if w else "—", json.dumps(w.config, sort_keys=True) if w else
                     ("none recorded yet" if p.ranked else "none (no trial succeeded)")])
    lines += columns(heads, rows)
    lines += [f"  {name}: {note.strip()[1:-1]}" for note, name in notes.items() if note]
    lines.append(f"  {changes_text(a)}")
    if a.ranked and a.state == "complete" and not any(p.winner is not None for p in a.problems):
        lines.append(f"  winners: best.json and snapshot.json missing or damaged (sweep "
                     f"resume {a.path} rebuilds them)")
    if top > 0 and a.ranked:
        lines += _problem_tops(a, top)
    return lines


def _problem_tops(a: Analysis, top: int) -> list[str]:
    rows = []
    for p in a.problems:
        for n, r in enumerate(p.ranked[:top]):
            rows.append([p.label if n == 0 else "", f"{'★ ' if r.winner else ''}{r.rank}",
                         f"#{r.index}", *_retimed_cell(a, r),
                         _spread(r.latency_ms, r.latency_p20_ms, r.latency_p80_ms),
                         json.dumps(r.config, sort_keys=True)])
    return [f"top {top} of each problem, of those that worked (★ its winner; "
            f"{ranked_by(a)}):",
            *columns(["problem", "rank", "index",
                      *(["re-timed ms [p20–p80]"] if a.retimed else []),
                      "one pass ms [p20–p80]", "config"], rows)]


def problem_effects(a: Analysis) -> list[str]:
    """Each parameter's effect within each problem: a value's latency at one size says
    nothing of another's."""
    varied = [k for k, e in enumerate(a.problems[0].effects) if len(e.values) > 1]
    if not varied:
        return []
    lines = ["parameters, per problem (per value: trials that worked of those run · "
             "median / best ms of the one pass):"]
    width = max(len(a.problems[0].effects[k].parameter) for k in varied)
    label = max(len(p.label) for p in a.problems)
    for k in varied:
        for n, p in enumerate(a.problems):
            name = p.effects[k].parameter if n == 0 else ""
            lines.append(f"  {name:<{width}}  {p.label:<{label}}  {effect_cells(p.effects[k])}")
    return lines


def problem_trials(p: Problem) -> str:
    """Its trials that worked of those run, and of its configs where not all ran."""
    ran = p.done - p.counts.get(PRUNED, 0)
    of = f" of {p.configs}" if p.configs is not None and ran < p.configs else ""
    return f"{p.counts.get('ok', 0)}/{ran}{of}"


def changes_text(a: Analysis) -> str:
    """Which winning values differ by problem, each problem's in turn."""
    changes = a.winner_changes()
    if not changes:
        return "every problem's winner has the same config" if \
            any(p.chosen for p in a.problems) else "no problem has a winner yet"
    parts = [f"{k} " + " → ".join(json.dumps(p.chosen.config.get(k)) if p.chosen else "—"
                                   for p in a.problems) for k in changes]
    order = " → ".join(p.label for p in a.problems)
    return f"winning values that differ by problem ({order}): {' · '.join(parts)}"


def versus(speedup: float) -> str:
    """speedup_text, as a table's cell: 1.61× faster, 7,518× slower."""
    text = speedup_text(speedup)
    return "matches" if text.startswith("matches") else text.removeprefix("is ")


def columns(heads: list[str], rows: list[list[str]]) -> list[str]:
    """A table as text, each column as wide as its widest cell (the last left ragged),
    its cells as a terminal shows them (a problem's value escaped, see printable)."""
    heads, rows = [printable(c) for c in heads], [[printable(c) for c in r] for r in rows]
    widths = [max(len(c) for c in column) for column in zip(heads, *rows)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + "  " + cells[-1]
            for cells in (heads, *rows)]


def _problem_of_index(a: Analysis) -> dict[int, str]:
    """In a sweep over problems, " (M=16)" after each trial's index; nothing otherwise."""
    if not a.problems:
        return {}
    return {t["index"]: f" ({a.problems[t['problem_at']].label})" for t in a.trials
            if t.get("problem_at") is not None}
