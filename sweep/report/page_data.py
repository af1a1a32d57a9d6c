"""The HTML page's data: the analysis's records as the JSON its script reads, in columns
and merged bars so that a page of 100,000 trials stays small and draws in seconds."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from sweep.numbers import scale
from sweep.report.rates import rate_field
from sweep.report.timeline import Span

if TYPE_CHECKING:
    from sweep.report.analysis import Analysis
    from sweep.report.ranking import Problem

# What the page's trial table reads of each trial (its columns, and the ranking it sorts
# latency by); the rate column's field is added where the kernel gives its work.
_TABLE_FIELDS = ("status", "latency_ms", "latency_p20_ms", "latency_p80_ms", "retimed_ms",
                 "rank", "compile_ms", "validation", "device", "node", "worker", "attempt",
                 "error")

# More bars than this take plotly minutes to draw (100,000 trials: about 150 s in Chromium),
# and far more than a plot's width can tell apart.
MAX_BARS = 20_000
# Of the run's whole span: about one pixel of a wide plot.
BAR_RESOLUTION = 1 / 2000


def page_data(a: Analysis) -> dict[str, Any]:
    """Everything the page's script draws from; it computes no figure of its own."""
    summary = a.summary(0)
    heatmap = a.default_heatmap()
    return {
        "parameters": a.parameters, "trials": _trial_columns(a),
        # The index of the trial the page marks as the winner (★, highlighted).
        "winner": next((t["index"] for t in a.trials if t["winner"]), None),
        "spans": _span_columns(a),
        "effects": summary["effects"], "heatmaps": summary["heatmaps"],
        "rate": _rate_column(a),
        # The heatmap's axes until the reader picks others (see Analysis.default_heatmap).
        "heatmap": [heatmap.x, heatmap.y] if heatmap is not None else None,
        **(_problems(a) if a.problems else {}),
    }


def _problems(a: Analysis) -> dict[str, Any]:
    """A sweep over problems: each problem's winner, effects and heatmaps (the plots
    follow the problem picked), and the parameters whose winning value differs by
    problem (the winner-across-problems plot's lines)."""
    def winner(p: Problem) -> dict[str, Any] | None:
        w = p.chosen
        return None if w is None else {
            "index": w.index, "config": w.config, "device": w.device,
            "latency_ms": w.latency_ms, "retimed_ms": w.retimed_ms, "best_ms": w.best_ms}

    return {"problem_keys": a.problem_keys, "winner_changes": a.winner_changes(),
            "problems": [{"label": p.label, "winner": winner(p),
                          "effects": [asdict(e) for e in p.effects],
                          "heatmaps": [asdict(m) for m in p.heatmaps]} for p in a.problems]}


def script_json(value: Any) -> str:
    """JSON that can sit inside a <script> element: no <, > or & for the HTML parser to
    act on (a "</script>" or "<!--" in an error text), and no NaN or infinity, which
    JSON.parse refuses."""
    text = json.dumps(_finite(value), default=str, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _trial_columns(a: Analysis) -> dict[str, Any]:
    """The trials the page's table pages through, one array per field (in index order)
    rather than an object per trial: a field's name is written once, not once a trial."""
    rate = rate_field(a)
    fields = ("index", *a.problem_keys, *a.parameters, *_TABLE_FIELDS,
              *([rate[0]] if rate else []), *(["problem_at"] if a.problems else []))
    columns = _columns(a.trials, fields)
    if a.problems:  # latency sorts problem by problem, each by its ranking
        order = {r.index: n for n, r in enumerate(a.ranked)}
        columns["order"] = [order.get(t["index"]) for t in a.trials]
    return columns


def _span_columns(a: Analysis) -> dict[str, Any]:
    """The timeline's spans, one array per field, their times to the microsecond: seconds
    from timestamps since the epoch, which hold about a fifth of a microsecond, so the
    digits beyond are noise (and were half of the spans' bytes)."""
    return _columns([{**asdict(s), "start_s": round(s.start_s, 6), "end_s": round(s.end_s, 6)}
                     for s in drawable(a.spans)],
                    ("worker", "start_s", "end_s", "kind", "index"))


def drawable(spans: list[Span]) -> list[Span]:
    """At most about MAX_BARS spans that draw the same picture: on each worker, waits too
    short to see are left out and neighbours of one kind closer than a pixel become one
    bar (its trial unnamed). A failure between two successes stays a bar of its own."""
    if len(spans) <= MAX_BARS:
        return spans
    tick = (max(s.end_s for s in spans) - min(s.start_s for s in spans)) * BAR_RESOLUTION
    out: list[Span] = []
    workers: dict[str, list[Span]] = {}
    for span in spans:
        workers.setdefault(span.worker, []).append(span)
    for mine in workers.values():
        last: Span | None = None
        for span in sorted(mine, key=lambda s: s.start_s):
            if span.kind == "waiting" and span.end_s - span.start_s < tick:
                continue
            if last is not None and last.kind == span.kind and \
                    span.start_s - last.end_s < tick:
                last = replace(last, end_s=max(last.end_s, span.end_s), index=None)
                continue
            if last is not None:
                out.append(last)
            last = span
        if last is not None:
            out.append(last)
    return out


def _columns(rows: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[str, Any]:
    """`rows` as one array per field. A field of few distinct strings (a status, a device,
    a worker) is written as {"values": [each once], "codes": [a position in values per
    row]}: a digit or two a row instead of the text; the page decodes it once on load."""
    out: dict[str, Any] = {}
    for f in fields:
        column = [r[f] for r in rows]
        if all(v is None or isinstance(v, str) for v in column):
            positions: dict[str | None, int] = {}
            codes = [positions.setdefault(v, len(positions)) for v in column]
            if len(positions) * 2 <= len(column):
                out[f] = {"values": list(positions), "codes": codes}
                continue
        out[f] = column
    return out


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _rate_column(a: Analysis) -> dict[str, Any] | None:
    """The trial table's rate column: the trials' field, and the one unit that puts the
    column's largest value between 1 and 1000 (its heading), with the factor from the
    field's unit to it. The page formats each cell as rates.rate_column does."""
    field = rate_field(a)
    if field is None:
        return None
    key, unit, size = field
    name, factor = scale([t[key] * size for t in a.trials if t[key] is not None], unit)
    return {"key": key, "name": name, "factor": size * factor}
