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
from sweep.report.analysis import Analysis, Ranked
from sweep.report.page_data import page_data, script_json
from sweep.report.rates import rate_column, rates
from sweep.report.text import baseline_name, baseline_note, speedup_text, worker_use
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
             "TOP": _top(a), "FAILURES": _failures(a), "META": _metadata(a),
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
    if winner is not None:
        how = (f"{_ms(winner.retimed_ms)} ms re-timed side by side "
               f"[{_ms(winner.retimed_p20_ms)}–{_ms(winner.retimed_p80_ms)}], one pass "
               f"{_ms(winner.latency_ms)} ms") if winner.retimed_ms is not None \
            else f"{_ms(winner.latency_ms)} ms [{_ms(winner.latency_p20_ms)}–" \
                 f"{_ms(winner.latency_p80_ms)}]"
        rate = "".join(f" · {r}" for r in rates(winner))
        partial = " <b>(partial: not a complete run's settled pick)</b>" if a.partial else ""
        rows.append(("winner", f"#{winner.index} <code>{_e(_config(winner))}</code> "
                               f"{how} on {_e(winner.device)}{_e(rate)}{partial}"))
    else:
        rows.append(("winner", "none recorded" if a.ranked else "none: no trial succeeded"))
    for b in a.baseline:
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
        "rank", "index", "re-timed ms", "p20–p80", "one pass ms", "p20–p80",
        *([rate] if rate else []), "device", "config"))
    body = []
    for r, value in zip(a.top(k), values):
        cells = [("★ " if r.winner else "") + str(r.rank), f"#{r.index}", _ms(r.retimed_ms),
                 f"{_ms(r.retimed_p20_ms)}–{_ms(r.retimed_p80_ms)}"
                 if r.retimed_ms is not None else "", _ms(r.latency_ms),
                 f"{_ms(r.latency_p20_ms)}–{_ms(r.latency_p80_ms)}",
                 *([value] if rate else []), r.device, _config(r)]
        body.append(f'<tr class="{"winner" if r.winner else ""}">'
                    + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return (f"<p>The {len(body)} fastest of {len(a.ranked)} that worked: finalists by their "
            "side-by-side re-timing, which chose the winner (★), then the rest by the "
            f"sweep's one pass.</p><table class='grid'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


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
                                   or "not given by the kernel"))]
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (f"<table class='kv'>{table}</table><h3>Spec as run</h3>"
            f"<pre>{_e(json.dumps(a.spec, indent=2, sort_keys=True))}</pre>")


def _work(key: str, value: float) -> str:
    unit = {"flops": "FLOP", "bytes_moved": "B"}.get(key)
    return amount(value, unit) if unit else significant(value)
