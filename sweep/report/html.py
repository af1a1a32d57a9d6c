"""`sweep report DIR --html`: one self-contained HTML file.

Everything it needs is inside it (plotly.js, the styles, the data), so it opens from a
laptop's disk, an artefact store or an air-gapped cluster without fetching anything. The
static parts (summary, top configs, failures, metadata) are written here as HTML; the
trial table and the plots are drawn in the page from the analysis's records, which the
page carries as JSON, one array per field. No figure is computed in the page: it sorts
and filters every trial, draws a page of the result at a time (a table of 100,000 rows
takes a browser minutes) and picks what to plot.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from storage.atomic import write_bytes_atomically
from storage.records import PRUNED
from sweep.report.analysis import Analysis, Ranked, Span
from sweep.report.numbers import amount, scale, significant
from sweep.report.text import (
    baseline_name,
    baseline_note,
    how_many,
    rate_column,
    rate_field,
    rates,
    speedup_text,
    worker_use,
)
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
    summary = a.summary(0)
    heatmap = a.default_heatmap()
    data = {
        "parameters": a.parameters, "trials": _trial_columns(a),
        # The index of the trial the page marks as the winner (★, highlighted).
        "winner": next((t["index"] for t in a.trials if t["winner"]), None),
        "spans": _span_columns(a),
        "effects": summary["effects"], "heatmaps": summary["heatmaps"],
        "rate": _rate_column(a),
        # The heatmap's axes until the reader picks others (see Analysis.default_heatmap).
        "heatmap": [heatmap.x, heatmap.y] if heatmap is not None else None,
    }
    parts = {"TITLE": html.escape(f"sweep report: {a.name}"), "SUMMARY": _summary(a),
             "TOP": _top(a), "FAILURES": _failures(a), "META": _metadata(a),
             "PLOTLY": plotly_js, "DATA": _script_json(data)}
    # One pass: a part that happens to hold "@@DATA@@" (a run's name) stays text.
    return _SLOT.sub(lambda m: parts[m.group(1)], _PAGE)


_SLOT = re.compile(r"@@([A-Z]+)@@")


def _script_json(value: Any) -> str:
    """JSON that can sit inside a <script> element: no <, > or & for the HTML parser to
    act on (a "</script>" or "<!--" in an error text), and no NaN or infinity, which
    JSON.parse refuses."""
    text = json.dumps(_finite(value), default=str, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# What the page's trial table reads of each trial (its columns, and the ranking it sorts
# latency by); the rate column's field is added where the kernel gives its work.
_TABLE_FIELDS = ("status", "latency_ms", "latency_p20_ms", "latency_p80_ms", "retimed_ms",
                 "rank", "compile_ms", "validation", "device", "node", "worker", "attempt",
                 "error")


def _trial_columns(a: Analysis) -> dict[str, Any]:
    """The trials the page's table pages through, one array per field (in index order)
    rather than an object per trial: a field's name is written once, not once a trial."""
    rate = rate_field(a)
    fields = ("index", *a.parameters, *_TABLE_FIELDS, *([rate[0]] if rate else []))
    return _columns(a.trials, fields)


def _span_columns(a: Analysis) -> dict[str, Any]:
    """The timeline's spans, one array per field, their times to the microsecond: seconds
    from timestamps since the epoch, which hold about a fifth of a microsecond, so the
    digits beyond are noise (and were half of the spans' bytes)."""
    return _columns([{**asdict(s), "start_s": round(s.start_s, 6), "end_s": round(s.end_s, 6)}
                     for s in drawable(a.spans)],
                    ("worker", "start_s", "end_s", "kind", "index"))


# More bars than this take plotly minutes to draw (100,000 trials: about 150 s in Chromium),
# and far more than a plot's width can tell apart.
MAX_BARS = 20_000
# Of the run's whole span: about one pixel of a wide plot.
BAR_RESOLUTION = 1 / 2000


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
    field's unit to it. The page formats each cell as report.rate_column does."""
    field = rate_field(a)
    if field is None:
        return None
    key, unit, size = field
    name, factor = scale([t[key] * size for t in a.trials if t[key] is not None], unit)
    return {"key": key, "name": name, "factor": size * factor}


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


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@@TITLE@@</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 16px 24px; color: #1d2330; }
h1 { font-size: 22px; margin: 4px 0 12px; } h2 { font-size: 17px; margin: 28px 0 8px; }
h3 { font-size: 14px; }
code, pre, td.mono { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
pre { background: #f5f6f8; padding: 10px; overflow: auto; max-height: 360px; }
table.kv th { text-align: left; padding: 2px 14px 2px 0; vertical-align: top;
              white-space: nowrap; color: #555; font-weight: 600; }
table.grid { border-collapse: collapse; width: 100%; }
table.grid th, table.grid td { border-bottom: 1px solid #e3e5ea; padding: 3px 8px;
                               text-align: left; white-space: nowrap; }
table.grid td:last-child { white-space: normal; }
table.grid thead th { background: #f0f2f5; position: sticky; top: 0; }
tr.winner td { background: #fff6d6; font-weight: 600; }
.chip { display: inline-block; padding: 0 7px; margin: 0 3px; border-radius: 9px;
        font-size: 12px; background: #e8eaee; }
.s-ok { background: #d8f0dc; } .s-compile_error { background: #ffe3c4; }
.s-runtime_error { background: #ffd0d0; } .s-incorrect { background: #ead9f7; }
.s-timeout { background: #eee0cc; } .s-crashed { background: #d4d4d4; }
.s-pruned { color: #8a8f98; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; }
.plot { border: 1px solid #e3e5ea; border-radius: 6px; padding: 8px; }
.plot.wide { grid-column: 1 / -1; }
/* Their heights before they are drawn (after the first paint): nothing below moves. */
#plot-latency, #plot-effects, #plot-heatmap { min-height: 340px; }
#plot-timeline { min-height: 220px; }
.controls { margin: 4px 0 8px; } .controls label { margin-right: 14px; }
#trials-wrap { max-height: 640px; overflow: auto; border: 1px solid #e3e5ea; }
/* The trial table and its controls take the window's width, not the text's: the table
   scrolls sideways only where its columns do not fit in the window. */
.full { margin-left: calc(50% - 50vw + 24px); margin-right: calc(50% - 50vw + 24px); }
#trials th { cursor: pointer; user-select: none; }
#trials th.sorted-asc::after { content: " ▲"; } #trials th.sorted-desc::after { content: " ▼"; }
#trials td { white-space: nowrap; }
.note { color: #666; font-size: 12px; }
</style>
<script>@@PLOTLY@@</script>
</head><body>
<h1>@@TITLE@@</h1>
<table class="kv">@@SUMMARY@@</table>
<h2>Fastest configs</h2>@@TOP@@
<h2>Failures, grouped by cause</h2>@@FAILURES@@
<h2>Plots</h2>
<div class="plots">
 <div class="plot"><div id="plot-latency"></div></div>
 <div class="plot"><div class="controls"><label>parameter
   <select id="effect-param"></select></label></div><div id="plot-effects"></div></div>
 <div class="plot"><div class="controls"><label>x <select id="heat-x"></select></label>
   <label>y <select id="heat-y"></select></label></div><div id="plot-heatmap"></div></div>
 <div class="plot wide"><div id="plot-timeline"></div>
  <p class="note">Each worker's trials over time, coloured by status; grey: the worker waited
  between two trials (for a compile, or for work); blue: its session starting (Ray, the
  workers, the first compiles) before its first trial; yellow: the fastest configs
  re-timed side by side after the last trial.</p></div>
</div>
<h2>Every trial</h2>
<div class="controls full">
 <label>filter <input id="filter" size="40" placeholder="text in any column"></label>
 <label>status <select id="status-filter"><option value="">any</option></select></label>
 <button id="prev-page" type="button">‹ previous</button> <span id="page"></span>
 <button id="next-page" type="button">next ›</button> <span id="shown"></span>
 <span class="note">Click a heading to sort. Latency sorts by the ranking: finalists by their
 re-timing, then the rest by their one pass.</span>
</div>
<div id="trials-wrap" class="full"><table id="trials" class="grid"><thead><tr></tr></thead>
<tbody></tbody></table></div>
<h2>Run metadata</h2>@@META@@
<script type="application/json" id="sweep-data">@@DATA@@</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("sweep-data").textContent);
const COLORS = {ok: "#3a9d5d", compile_error: "#f08c2e", runtime_error: "#d64545",
  incorrect: "#8e5cc4", timeout: "#9a7443", crashed: "#333333", waiting: "#cfd3da",
  starting: "#a9c4e4", "re-timing": "#e0b84a"};
// The mode bar (zoom, save as PNG) shows while the pointer is on a plot, over its title.
const CONFIG = {displaylogo: false, responsive: true, displayModeBar: "hover"};
// Numbers as sweep/report/numbers.py's significant() writes them: `digits` significant digits in
// fixed notation, trailing zeros dropped, every digit of the integer part kept (1100 and
// 694, never 1.1e+3; 0.01234); an exponent only outside 1e-6 to 1e15.
const num = (v, digits = 4) => {
  if (!Number.isFinite(v)) return String(v);
  if (v === 0) return "0";
  const exponent = Number(Math.abs(v).toExponential(digits - 1).split("e")[1]);
  if (exponent < -6 || exponent >= 15)
    return v.toExponential(digits - 1).replace(/e([+-])(\\d)$/, "e$10$2");
  let text = v.toFixed(Math.max(0, digits - 1 - exponent));
  if (text.includes(".")) text = text.replace(/0+$/, "").replace(/\\.$/, "");
  return text === "-0" ? "0" : text;
};
const fmt = v => v === null || v === undefined ? "" :
  (typeof v === "number" && !Number.isInteger(v) ? num(v) : String(v));
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
  '"': "&quot;"})[c]);
const label = v => JSON.stringify(v);
const clip = (s, n) => s.length > n ? s.slice(0, n - 1) + "…" : s;

// --- the trial table -------------------------------------------------------------------
// The data holds one array per field (see _columns); T.status[i] is trial i's status.
const columns = t => Object.fromEntries(Object.entries(t).map(([k, c]) =>
  [k, Array.isArray(c) ? c : c.codes.map(n => c.values[n])]));
const T = columns(D.trials), S = columns(D.spans);
const N = T.index.length;
const WINNER = T.index.indexOf(D.winner);  // -1: none
// The rate column in one unit, the one that puts its largest value between 1 and 1000
// (D.rate, chosen with the report's own rules), three significant digits.
const RATE = D.rate;
const COLUMNS = [
  {key: "index", name: "index"},
  ...D.parameters.map(p => ({key: p, name: p, text: String})),  // a value as the spec gives it
  {key: "status", name: "status"},
  {key: "latency", name: "latency ms", value: i => T.retimed_ms[i] ?? T.latency_ms[i],
   sortBy: i => T.rank[i],
   tip: "re-timed side by side for a finalist, else the one pass; sorts by the ranking"},
  {key: "latency_ms", name: "one pass ms", tip: "the sweep's one timing of this config"},
  {key: "latency_p20_ms", name: "one pass p20", tip: "spread of the one pass"},
  {key: "latency_p80_ms", name: "one pass p80", tip: "spread of the one pass"},
  {key: "retimed_ms", name: "re-timed ms", tip: "finalists only: the side-by-side re-timing"},
  ...(RATE ? [{key: RATE.key, name: RATE.name, text: v => num(v, 3),
               value: i => T[RATE.key][i] === null ? null : T[RATE.key][i] * RATE.factor}]
     : []),
  {key: "compile_ms", name: "compile ms"}, {key: "validation", name: "validation"},
  {key: "device", name: "device"},
  {key: "worker", name: "worker", value: i => T.node[i] + "/" + T.worker[i]},
  {key: "attempt", name: "attempt"}, {key: "error", name: "error"},
];
// The table holds one page of the sorted, filtered trials: a browser takes minutes to lay
// out a table of 100,000 rows, and milliseconds for 100.
const PAGE = 100;
let sortCol = null, sortDir = 1, order = [], page = 0;
const head = document.querySelector("#trials thead tr");
COLUMNS.forEach(c => {
  const th = document.createElement("th");
  th.textContent = c.name; th.dataset.key = c.key;
  if (c.tip) th.title = c.tip;
  th.addEventListener("click", () => {
    sortDir = sortCol === c ? -sortDir : 1; sortCol = c; drawTable();
  });
  head.appendChild(th);
});
const statusSel = document.getElementById("status-filter");
[...new Set(T.status)].sort().forEach(s => {
  const o = document.createElement("option"); o.value = o.textContent = s;
  statusSel.appendChild(o);
});
const cellValue = (c, i) => c.value ? c.value(i) : T[c.key][i];
const cellText = (c, i) => {
  const v = cellValue(c, i);
  return c.text && v !== null && v !== undefined ? c.text(v) : fmt(v);
};
// Each trial's text, for the filter: made on its first use, not on every page's load.
let texts = null;
const textOf = i => (texts ??= Array.from({length: N}, (_, j) =>
  COLUMNS.map(c => cellText(c, j)).join(" ").toLowerCase()))[i];
const empty = v => v === null || v === undefined;
// Sort and filter every trial; the page shown goes back to the first.
function drawTable() {
  const needle = document.getElementById("filter").value.trim().toLowerCase();
  const status = statusSel.value;
  order = [];
  for (let i = 0; i < N; i++)
    if ((!status || T.status[i] === status) && (!needle || textOf(i).includes(needle)))
      order.push(i);
  if (sortCol) {
    const key = sortCol.sortBy || (i => cellValue(sortCol, i));
    const keys = new Array(N);
    order.forEach(i => { keys[i] = key(i); });
    order.sort((i, j) => {
      const a = keys[i], b = keys[j];
      if (empty(a)) return empty(b) ? i - j : 1;
      if (empty(b)) return -1;  // empty cells last either way
      const c = typeof a === "number" && typeof b === "number" ? a - b
        : String(a).localeCompare(String(b));
      return c !== 0 ? sortDir * c : i - j;
    });
  }
  document.querySelectorAll("#trials th").forEach(th => th.className =
    sortCol && th.dataset.key === sortCol.key ? (sortDir > 0 ? "sorted-asc" : "sorted-desc") : "");
  page = 0;
  drawPage();
}
const td = (text, title) => {
  const cell = document.createElement("td");
  cell.textContent = text;  // text, never markup, whatever an error holds
  if (title !== undefined) cell.title = title;
  return cell;
};
function drawPage() {
  const pages = Math.max(1, Math.ceil(order.length / PAGE));
  page = Math.min(Math.max(page, 0), pages - 1);
  const from = page * PAGE, drawn = order.slice(from, from + PAGE);
  const rows = drawn.map(i => {
    const tr = document.createElement("tr");
    tr.dataset.index = T.index[i];
    if (i === WINNER) tr.className = "winner";
    COLUMNS.forEach(c => {
      if (c.key === "status") {
        const chip = document.createElement("span");
        chip.className = "chip s-" + T.status[i]; chip.textContent = T.status[i];
        tr.appendChild(td("")).appendChild(chip);
      } else if (c.key === "error") {
        const error = T.error[i] ?? "";
        tr.appendChild(td(clip(error.split("\\n")[0], 90), error));
      } else {
        tr.appendChild(td((c.key === "index" && i === WINNER ? "★ " : "") + cellText(c, i)));
      }
    });
    return tr;
  });
  document.querySelector("#trials tbody").replaceChildren(...rows);
  document.getElementById("page").textContent = `page ${page + 1} of ${pages}`;
  document.getElementById("prev-page").disabled = page === 0;
  document.getElementById("next-page").disabled = page >= pages - 1;
  document.getElementById("shown").textContent = (order.length === N
    ? `${N} trials` : `${order.length} of ${N} trials`) +
    (order.length > drawn.length && drawn.length
      ? ` (${from + 1}–${from + drawn.length} shown)` : "");
}
const turn = by => () => { page += by; drawPage(); };
document.getElementById("prev-page").addEventListener("click", turn(-1));
document.getElementById("next-page").addEventListener("click", turn(1));
let typing = null;
document.getElementById("filter").addEventListener("input", () => {
  clearTimeout(typing); typing = setTimeout(drawTable, 150);
});
statusSel.addEventListener("change", drawTable);
drawTable();

// --- plots ------------------------------------------------------------------------------
// Axes of ms and seconds say exponentformat "none": 2000, as the report writes it, not 2k.
const layout = (title, extra) => Object.assign({
  title: {text: title, font: {size: 14}, x: 0.01, xanchor: "left"},
  margin: {l: 60, r: 40, t: 40, b: 50}, height: 340}, extra);

function latency() {
  const xs = T.latency_ms.filter((_, i) => T.status[i] === "ok");
  // Binned here, not by plotly: the counts are known, so the y axis ticks whole numbers
  // only (a step of 1, 2, 5, 10, ... trials), never the fractions plotly picks for a few.
  const bins = Math.min(60, Math.max(10, Math.round(Math.sqrt(xs.length) * 2)));
  // A loop, not Math.min(...xs): a spread of 100,000 arguments overflows the stack.
  let lo = xs.length ? Infinity : 0, hi = xs.length ? -Infinity : 1;
  xs.forEach(x => { lo = Math.min(lo, x); hi = Math.max(hi, x); });
  const size = (hi - lo) / bins || Math.abs(lo) / bins || 1;
  const counts = new Array(bins).fill(0);
  xs.forEach(x => counts[Math.min(bins - 1, Math.floor((x - lo) / size))]++);
  const most = Math.max(1, ...counts);
  let step = 1;
  for (let k = 1; most / step > 6; k++) step = [1, 2, 5][k % 3] * 10 ** Math.floor(k / 3);
  const shapes = [], notes = [];
  const mark = (x, text, color) => {
    shapes.push({type: "line", x0: x, x1: x, yref: "paper", y0: 0, y1: 1,
                 line: {color, dash: "dot"}});
    notes.push({x, yref: "paper", y: 1, text, showarrow: false, yanchor: "bottom",
                font: {size: 11, color}});
  };
  if (WINNER >= 0) mark(T.latency_ms[WINNER], "winner #" + T.index[WINNER], "#b8860b");
  const edges = counts.map((_, i) => lo + i * size);
  Plotly.newPlot("plot-latency", [{type: "bar", x: edges.map(e => e + size / 2), y: counts,
      width: size, marker: {color: COLORS.ok}, hoverinfo: "text",
      hovertext: edges.map((e, i) => `${num(e)}–${num(e + size)} ms: ${counts[i]} trials`)}],
    layout(`Latency of the ${xs.length} trials that worked (one pass)`,
      {xaxis: {title: {text: "ms"}, exponentformat: "none"},
       yaxis: {title: {text: "trials"}, tick0: 0, dtick: step, tickformat: "d",
               rangemode: "tozero"},
       shapes, annotations: notes, bargap: 0.05}), CONFIG);
}

const effectSel = document.getElementById("effect-param");
D.effects.forEach(e => {
  const o = document.createElement("option"); o.value = o.textContent = e.parameter;
  effectSel.appendChild(o);
});
const varied = D.effects.filter(e => e.values.length > 1);
if (varied.length) effectSel.value = varied[0].parameter;
function drawEffects() {
  const e = D.effects.find(x => x.parameter === effectSel.value);
  if (!e) return;
  const xs = e.values.map(v => label(v.value));
  const bar = (name, ms, color) => ({type: "bar", name, x: xs, y: ms, marker: {color},
    hoverinfo: "text", hovertext: e.values.map((v, i) => `${e.parameter} ${xs[i]}: ${name} ` +
      (ms[i] === null ? "—" : num(ms[i]) + " ms") + ` (${v.ok} of ${v.trials} worked)`)});
  Plotly.react("plot-effects", [
    bar("median", e.values.map(v => v.median_ms), "#7aa6d8"),
    bar("best", e.values.map(v => v.best_ms), "#2f5f98")],
    layout(`Effect of ${e.parameter}: latency per value (ms, one pass)`,
      {barmode: "group", xaxis: {type: "category", title: {text: e.parameter}},
       yaxis: {title: {text: "ms"}, exponentformat: "none"}}), CONFIG);
}
effectSel.addEventListener("change", drawEffects);

const hx = document.getElementById("heat-x"), hy = document.getElementById("heat-y");
const heatParams = varied.map(e => e.parameter);
heatParams.forEach(p => [hx, hy].forEach(sel => {
  const o = document.createElement("option"); o.value = o.textContent = p; sel.appendChild(o);
}));
// The report's pick (under the interpreter, parameters that are not launch options).
if (D.heatmap) { hx.value = D.heatmap[0]; hy.value = D.heatmap[1]; }
function drawHeatmap() {
  let m = D.heatmaps.find(h => h.x === hx.value && h.y === hy.value), flip = false;
  if (!m) { m = D.heatmaps.find(h => h.x === hy.value && h.y === hx.value); flip = true; }
  if (!m) {
    Plotly.react("plot-heatmap", [], layout(heatParams.length > 1
      ? "Pick two different parameters" : "No two parameters take several values"), CONFIG);
    return;
  }
  let xs = m.x_values.map(label), ys = m.y_values.map(label), z = m.best_ms;
  // best_ms is [y][x]; swapped, the page's rows are the record's columns.
  if (flip) { [xs, ys] = [ys, xs]; z = ys.map((_, i) => xs.map((_, j) => m.best_ms[j][i])); }
  const xName = flip ? m.y : m.x, yName = flip ? m.x : m.y;
  const text = z.map(row => row.map(v => v === null ? "" : num(v)));
  Plotly.react("plot-heatmap", [{type: "heatmap", x: xs, y: ys, z, text, colorscale: "Viridis",
      reversescale: true, hoverongaps: false,
      colorbar: {title: {text: "ms"}, exponentformat: "none"},
      hovertemplate: `${esc(xName)} %{x}<br>${esc(yName)} %{y}<br>best %{text} ms` +
        "<extra></extra>"}],
    layout(`Best latency (ms) by ${xName} and ${yName}`,
      {xaxis: {type: "category", title: {text: xName}},
       yaxis: {type: "category", title: {text: yName}}}), CONFIG);
}
hx.addEventListener("change", drawHeatmap); hy.addEventListener("change", drawHeatmap);

function timeline() {
  // Drawn in this order, the last on top: a trial is never hidden under a wait, and the
  // rare failures stay visible where thousands of bars share a pixel.
  const first = ["waiting", "starting", "ok"];
  const kinds = [...new Set(S.kind)].sort((a, b) =>
    (first.includes(a) ? first.indexOf(a) : 9) - (first.includes(b) ? first.indexOf(b) : 9));
  const workers = [...new Set(S.worker)];
  const traces = kinds.map(kind => {
    const ss = [];
    S.kind.forEach((k, i) => { if (k === kind) ss.push(i); });
    return {type: "bar", orientation: "h", name: kind, y: ss.map(i => S.worker[i]),
      base: ss.map(i => S.start_s[i]), x: ss.map(i => Math.max(S.end_s[i] - S.start_s[i], 1e-4)),
      marker: {color: COLORS[kind] || "#888"},
      hovertext: ss.map(i => (S.index[i] === null ? kind : `#${S.index[i]} ${kind}`) +
        ` ${num(S.end_s[i] - S.start_s[i], 3)} s`), hoverinfo: "text"};
  });
  Plotly.newPlot("plot-timeline", traces, layout("Workers over time", {barmode: "overlay",
    height: Math.max(220, 60 + 28 * workers.length),
    xaxis: {title: {text: "seconds since the run began"}, exponentformat: "none"},
    yaxis: {type: "category", automargin: true, categoryorder: "category descending"}}),
    CONFIG);
}
// The plots once the summary and the table are painted: plotly lays the page out as it
// draws, and a timeline of 100,000 trials takes minutes to draw.
requestAnimationFrame(() => setTimeout(() => {
  latency(); drawEffects(); drawHeatmap(); timeline();
}));
</script>
</body></html>
"""
