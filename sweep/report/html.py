"""`sweep report DIR --html`: one self-contained HTML file.

Everything it needs is inside it (plotly.js, the styles, the data), so it opens from a
laptop's disk, an artefact store or an air-gapped cluster without fetching anything. The
static parts (summary, top configs, failures, metadata) are written here as HTML; the
trial table and the plots are drawn in the page from the analysis's records, which the
page carries as JSON (page_data.py). No figure is computed in the page: it sorts and
filters every trial, draws a page of the result at a time (a table of 100,000 rows takes a
browser minutes) and picks what to plot. The page's markup, styles and script are
page.html, a file of their own so that they read (and diff) as what they are.
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from storage.atomic import write_bytes_atomically
from storage.records import PRUNED
from sweep.numbers import amount, significant
from sweep.report.analysis import Analysis
from sweep.report.page_data import page_data, script_json
from sweep.report.ranking import Ranked
from sweep.report.rates import rate_column, rates
from sweep.report.text import (
    NOT_RETIMED,
    baseline_name,
    baseline_note,
    changes_text,
    chosen_by,
    problem_trials,
    ranked_by,
    speedup_text,
    versus,
    worker_use,
)
from sweep.results.summary import how_many
from sweep.spec import SpecError


def write_html(analysis: Analysis, path: Path) -> None:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise SpecError("--html: needs plotly (pip install 'triton-sweep[report]'; from a "
                        "clone, pip install -e '.[report]')") from None
    page = render(analysis, get_plotlyjs())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(path, page.encode())
    except OSError as e:
        raise SpecError(f"--html: {path}: {e.strerror or e}") from None


def render(a: Analysis, plotly_js: str) -> str:
    parts = {"TITLE": html.escape(f"sweep report: {a.name}"), "SUMMARY": _summary(a),
             "PROBLEMS": _problems(a), "PICK": _pick(a), "HEATMAP": _heatmap_panel(a),
             "TOP": _problem_tops(a) if a.problems else _top(a), "FAILURES": _failures(a),
             "META": _metadata(a),
             "PLOTLY": plotly_js, "DATA": script_json(page_data(a))}
    # One pass: a part that happens to hold "@@DATA@@" (a run's name) stays text.
    return _SLOT.sub(lambda m: parts[m.group(1)], _page())


_SLOT = re.compile(r"@@([A-Z]+)@@")


@cache
def _page() -> str:
    """page.html, packaged beside this module (pyproject.toml's package-data)."""
    return files("sweep.report").joinpath("page.html").read_text(encoding="utf-8")


def _e(value: Any) -> str:
    return html.escape(str(value))


def _ms(value: float | None) -> str:
    return "—" if value is None else significant(value)


def _summary(a: Analysis) -> str:
    chips = "".join(f'<span class="chip s-{_e(k)}">{_e(k)} {v}</span>'
                    for k, v in a.counts.items())
    rows = [("run", f"{_e(a.path)} · {_e(a.state)}"
                    + (f" · {a.sessions} sessions" if a.sessions > 1 else "")),
            ("kernel", f"{_e(a.kernel)} on {_e(', '.join(a.devices) or '?')}"),
            ("trials", f"{_e(how_many(a.done, a.total, a.counts.get(PRUNED, 0)))} {chips}")]
    winner = a.chosen
    if a.problems:
        rows.append(("winner", f"one per problem, of {len(a.problems)}: see Problems"))
    elif winner is not None:
        how = (f"{_ms(winner.retimed_ms)} ms re-timed side by side "
               f"[{_ms(winner.retimed_p20_ms)}–{_ms(winner.retimed_p80_ms)}], one pass "
               f"{_ms(winner.latency_ms)} ms") if winner.retimed_ms is not None \
            else f"{_ms(winner.latency_ms)} ms [{_ms(winner.latency_p20_ms)}–" \
                 f"{_ms(winner.latency_p80_ms)}]" + ("" if a.retimed else f" ({NOT_RETIMED})")
        rate = "".join(f" · {r}" for r in rates(winner))
        partial = " <b>(partial: not a complete run's settled pick)</b>" if a.partial else ""
        rows.append(("winner", f"#{winner.index} <code>{_e(_config(winner))}</code> "
                               f"{how} on {_e(winner.device)}{_e(rate)}{partial}"))
    else:
        rows.append(("winner", "none recorded" if a.ranked else "none: no trial succeeded"))
    for b in [] if a.problems else a.baseline:  # a sweep over problems: each one's, below
        rows.append((f"{baseline_name(b)} on {_e(b.device)}",
                     f"{_ms(b.latency_ms)} ms [{_ms(b.latency_p20_ms)}–{_ms(b.latency_p80_ms)}]"
                     f"; the best config {_e(speedup_text(b.speedup))}"
                     f"{_e(baseline_note(b))}"))
    for w in a.workers:
        rows.append((f"worker {_e(w.worker)}", f"on {_e(w.device)}: {_e(worker_use(w))}"))
    return "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)


def _config(r: Ranked) -> str:
    return json.dumps(r.config, sort_keys=True)


def _top(a: Analysis, k: int = 10) -> str:
    if not a.ranked:
        return "<p>No trial succeeded.</p>"
    rate, values = rate_column(a, a.top(k))
    head = "".join(f"<th>{h}</th>" for h in (
        "rank", "index", *_RETIMED_HEADS[:2 * a.retimed], "one pass ms", "p20–p80",
        *([rate] if rate else []), "device", "config"))
    body = []
    for r, value in zip(a.top(k), values):
        cells = [("★ " if r.winner else "") + str(r.rank), f"#{r.index}",
                 *_retimed_cells(a, r), _ms(r.latency_ms),
                 f"{_ms(r.latency_p20_ms)}–{_ms(r.latency_p80_ms)}",
                 *([value] if rate else []), r.device, _config(r)]
        body.append(f'<tr class="{"winner" if r.winner else ""}">'
                    + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return (f"<p>The {len(body)} fastest of {len(a.ranked)} that worked, the winner (★) "
            f"first: {_e(ranked_by(a))}.</p><table class='grid'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def _heatmap_panel(a: Analysis) -> str:
    """The heatmap's panel, where two parameters or more take several values (a heatmap
    of one would be an empty chart)."""
    if not a.heatmaps:
        return ""
    return ("<div class='plot'><div class='controls'><label>x <select id='heat-x'></select>"
            "</label> <label>y <select id='heat-y'></select></label></div>"
            "<div id='plot-heatmap'></div></div>")


# A table's re-timing columns: none where nothing was re-timed (the interpreter's runs).
_RETIMED_HEADS = ("re-timed ms", "p20–p80")


def _retimed_cells(a: Analysis, r: Ranked | None) -> list[str]:
    if not a.retimed:
        return []
    if r is None:
        return ["—", ""]
    return [_ms(r.retimed_ms), f"{_ms(r.retimed_p20_ms)}–{_ms(r.retimed_p80_ms)}"
            if r.retimed_ms is not None else ""]


def _failures(a: Analysis) -> str:
    if not a.errors:
        return "<p>No trial failed.</p>"
    rows = "".join(f"<tr><td><span class='chip s-{_e(g.status)}'>{_e(g.status)}</span></td>"
                   f"<td>{g.count}</td><td>#{g.index}</td><td><code>{_e(g.example)}</code>"
                   "</td></tr>" for g in a.errors)
    return ("<table class='grid'><thead><tr><th>status</th><th>trials</th><th>example</th>"
            f"<th>its error (numbers differ within a group)</th></tr></thead><tbody>{rows}"
            "</tbody></table>")


def _metadata(a: Analysis) -> str:
    rows = [("fingerprint", _e(a.fingerprint)),
            ("versions", _e(" · ".join(f"{k} {v}" for k, v in a.versions.items()))),
            ("devices", _e(", ".join(a.devices))),
            ("work per launch", _e(" · ".join(f"{k} {_work(k, v)}" for k, v in a.work.items())
                                   or ("the base problem's only: no throughput shown"
                                       if a.problems and a.spec.get("work")
                                       else "not given by the kernel")))]
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (f"<table class='kv'>{table}</table><h3>Spec as run</h3>"
            f"<pre>{_e(json.dumps(a.spec, indent=2, sort_keys=True))}</pre>")


def _work(key: str, value: float) -> str:
    unit = {"flops": "FLOP", "bytes_moved": "B"}.get(key)
    return amount(value, unit) if unit else significant(value)


# --- a sweep over problems ----------------------------------------------------------------

def _problems(a: Analysis) -> str:
    """A row per problem (its trials, its winner re-timed among its finalists, torch's
    time on the winner's device) and the winner-across-problems plot; nothing for a sweep
    of one problem."""
    if not a.problems:
        return ""
    torch = any(p.baseline for p in a.problems)
    head = "".join(f"<th>{h}</th>" for h in (
        "problem", "worked", "winner", *_RETIMED_HEADS[:2 * a.retimed], "one pass ms",
        *(["finalists"] if a.retimed else []),
        *(["torch ms", "vs torch"] if torch else []), "device", "config"))
    body, notes = [], {}
    for p in a.problems:
        w = p.chosen
        b = next((b for b in p.baseline if w is not None and b.device == w.device), None)
        if b is not None and baseline_note(b):
            notes[baseline_note(b).strip()[1:-1]] = baseline_name(b)
        cells = [p.label, problem_trials(p), f"#{w.index}" if w else "—",
                 *_retimed_cells(a, w), _ms(w.latency_ms) if w else "—",
                 *([str(p.finalists)] if a.retimed else []),
                 *([_ms(b.latency_ms) if b else "—", versus(b.speedup) if b else "—"]
                   if torch else []),
                 w.device if w else "—", _config(w) if w else
                 ("none recorded yet" if p.ranked else "none: no trial succeeded")]
        body.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    said = "".join(f"<p class='note'>{_e(name)}: {_e(note)}</p>" for note, name in notes.items())
    return (f"<h2>Problems</h2><p>{len(a.problems)} problems, by "
            f"{_e(', '.join(a.problem_keys))}: each one's winner chosen by "
            f"{_e(chosen_by(a))}"
            + (" <b>(partial: not a complete run's settled picks)</b>" if a.partial else "")
            + f".</p><table class='grid'><thead><tr>{head}</tr></thead><tbody>"
            f"{''.join(body)}</tbody></table>{said}<p>{_e(changes_text(a))}.</p>"
            "<div class='plot'><div id='plot-problems'></div></div>")


def _pick(a: Analysis) -> str:
    """The problem the latency, effect and heatmap plots show."""
    if not a.problems:
        return ""
    return ("<div class='controls'><label>problem <select id='problem-pick'></select>"
            "</label> <span class='note'>the latency, effect and heatmap plots show this "
            "problem's trials; the timeline every trial</span></div>")


def _problem_tops(a: Analysis, k: int = 5) -> str:
    """Each problem's top k, in one table."""
    if not a.ranked:
        return "<p>No trial succeeded.</p>"
    head = "".join(f"<th>{h}</th>" for h in (
        "problem", "rank", "index", *_RETIMED_HEADS[:2 * a.retimed], "one pass ms",
        "p20–p80", "device", "config"))
    body = []
    for p in a.problems:
        for n, r in enumerate(p.ranked[:k]):
            cells = [p.label if n == 0 else "", ("★ " if r.winner else "") + str(r.rank),
                     f"#{r.index}", *_retimed_cells(a, r), _ms(r.latency_ms),
                     f"{_ms(r.latency_p20_ms)}–{_ms(r.latency_p80_ms)}", r.device,
                     _config(r)]
            body.append(f'<tr class="{"winner" if r.winner else ""}">'
                        + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return (f"<p>The {k} fastest of each problem, of those that worked, its winner (★) "
            f"first: {_e(ranked_by(a))}.</p><table class='grid'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")
