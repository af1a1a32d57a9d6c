"""`sweep report DIR --plot OUT`: the HTML report's plots as PNG files, for a slide, a
paper or a pull request. Drawn with matplotlib from the same analysis records."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sweep.numbers import significant
from sweep.report.analysis import Analysis
from sweep.report.ranking import Heatmap
from sweep.spec import SpecError

# The HTML report's colours, so that both views read alike.
COLORS = {"ok": "#3a9d5d", "compile_error": "#f08c2e", "runtime_error": "#d64545",
          "incorrect": "#8e5cc4", "timeout": "#9a7443", "crashed": "#333333",
          "waiting": "#cfd3da", "starting": "#a9c4e4", "re-timing": "#e0b84a"}


def write_plots(a: Analysis, out: Path) -> list[Path]:
    """The PNGs written into `out` (made if missing): latency.png, effects.png,
    heatmap.png (the first two parameters that take several values) and timeline.png,
    each problem's apart in a sweep over problems, which adds problems.png (the winner
    across problems); a plot with nothing to show is left out."""
    try:
        import matplotlib
    except ImportError:
        raise SpecError("--plot: needs matplotlib (pip install 'triton-sweep[report]'; from "
                        "a clone, pip install -e '.[report]')") from None
    matplotlib.use("Agg")  # files only: no display needed, none opened
    if out.exists() and not out.is_dir():
        raise SpecError(f"--plot: {out}: not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(f"--plot: {out}: {e.strerror or e}") from None
    written = []
    for name, draw in (("latency", _latency), ("effects", _effects), ("heatmap", _heatmap),
                       ("timeline", _timeline), ("problems", _problems)):
        figure = draw(a)
        if figure is None:
            continue
        path = out / f"{name}.png"
        try:
            figure.savefig(path, dpi=120, bbox_inches="tight")
        except OSError as e:
            raise SpecError(f"--plot: {path}: {e.strerror or e}") from None
        finally:
            import matplotlib.pyplot as plt

            plt.close(figure)
        written.append(path)
    return written


def _figure(width: float, height: float) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def _plain(axis: Any) -> None:
    """Tick labels as the reports write numbers (sweep.numbers): no exponent or offset
    that matplotlib adds for large or close values (1100, not 1.1e3)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: significant(v)))


def _latency(a: Analysis) -> Any:
    if a.problems:
        return _latency_by_problem(a)
    xs = [r.latency_ms for r in a.ranked]
    if not xs:
        return None
    fig, ax = _figure(7, 4)
    ax.hist(xs, bins=min(60, max(10, round(math.sqrt(len(xs)) * 2))), color=COLORS["ok"],
            edgecolor="white")
    winner = a.chosen
    if winner is not None:
        ax.axvline(winner.latency_ms, color="#b8860b", linestyle=":",
                   label=f"winner #{winner.index}")
        ax.legend()
    ax.set(title=f"{a.name}: latency of the {len(xs)} trials that worked (one pass)",
           xlabel="ms", ylabel="trials")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: whole numbers only
    _plain(ax.xaxis)
    _plain(ax.yaxis)
    return fig


def _effects(a: Analysis) -> Any:
    varied = [e for e in a.effects if len(e.values) > 1]
    if not varied:
        return None
    if a.problems:
        return _effects_by_problem(a, [e.parameter for e in varied])
    import matplotlib.pyplot as plt

    cols = min(3, len(varied))
    rows = math.ceil(len(varied) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, e in zip(axes.flat, varied):
        labels = [json.dumps(v.value) for v in e.values]
        at = range(len(labels))
        ax.bar([i - 0.2 for i in at], [v.median_ms or 0 for v in e.values], 0.4,
               label="median", color="#7aa6d8")
        ax.bar([i + 0.2 for i in at], [v.best_ms or 0 for v in e.values], 0.4,
               label="best", color="#2f5f98")
        for i, v in zip(at, e.values):
            if v.median_ms is None:
                ax.text(i, 0, "none\nworked", ha="center", va="bottom", fontsize=8,
                        color="#555555")
        ax.set_xticks(list(at), labels)
        ax.set(title=e.parameter, ylabel="ms")
        _plain(ax.yaxis)
    for ax in list(axes.flat)[len(varied):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(f"{a.name}: latency per parameter value (one pass)", x=0.01, ha="left")
    fig.legend(handles, names, loc="upper right", ncols=2)
    fig.tight_layout()
    return fig


def _heatmap(a: Analysis) -> Any:
    m = a.default_heatmap()  # the HTML page's default pick
    if m is None:
        return None
    if a.problems:
        return _heatmaps_by_problem(a, m)
    fig, ax = _figure(6, 4.5)
    _heat(fig, ax, m, f"{a.name}: best latency (ms) by {m.x} and {m.y}")
    return fig


def _heat(fig: Any, ax: Any, m: Heatmap, title: str) -> None:
    z = [[math.nan if v is None else v for v in row] for row in m.best_ms]
    image = ax.imshow(z, cmap="viridis_r", origin="lower", aspect="auto")
    ax.set_xticks(range(len(m.x_values)), [json.dumps(v) for v in m.x_values])
    ax.set_yticks(range(len(m.y_values)), [json.dumps(v) for v in m.y_values])
    if len(m.x_values) * len(m.y_values) <= 64:  # room to write each cell's value
        low, high = image.get_clim()
        for row, values in enumerate(m.best_ms):
            for col, v in enumerate(values):
                # Dark text on the light (fast) end of the scale, light on the dark end.
                light = v is not None and high > low and (v - low) / (high - low) > 0.5
                ax.text(col, row, "—" if v is None else significant(v, 3), ha="center", va="center",
                        fontsize=8, color="white" if light else "black")
    ax.set(xlabel=m.x, ylabel=m.y, title=title)
    _plain(fig.colorbar(image, ax=ax, label="ms").ax.yaxis)


def _timeline(a: Analysis) -> Any:
    if not a.spans:
        return None
    workers = sorted({s.worker for s in a.spans}, reverse=True)
    fig, ax = _figure(10, max(2.0, 0.9 + 0.35 * len(workers)))
    from matplotlib.patches import Patch

    lanes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in a.spans:
        lanes.setdefault((s.worker, s.kind), []).append((s.start_s, s.end_s - s.start_s))
    # One collection per worker and kind: a bar per trial would take seconds per thousand.
    # Waits first, failures last (on top), as in the HTML report.
    order = {"waiting": 0, "starting": 1, "ok": 2}
    for (worker, kind), bars in sorted(lanes.items(), key=lambda e: order.get(e[0][1], 3)):
        ax.broken_barh(bars, (workers.index(worker) - 0.35, 0.7),
                       facecolors=COLORS.get(kind, "#888888"))
    kinds = sorted({kind for _, kind in lanes})
    ax.set_yticks(range(len(workers)), workers)
    ax.legend(handles=[Patch(color=COLORS.get(k, "#888888"), label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _plain(ax.xaxis)
    ax.set(xlabel="seconds since the run began",
           title=f"{a.name}: workers over time (grey: waiting for a compile or for work; "
                 "blue: starting; yellow: finalists re-timed)")
    return fig


# --- a sweep over problems: each problem's trials apart ----------------------------------

def _log_if_wide(values: list[float]) -> bool:
    """A logarithmic axis where values span more than 20×: a larger problem's latencies
    would flatten a smaller one's."""
    positive = [v for v in values if v > 0]
    return bool(positive) and len(positive) == len(values) and max(positive) > 20 * min(positive)


def _latency_by_problem(a: Analysis) -> Any:
    groups = [(p.label, [r.latency_ms for r in p.ranked], p.chosen) for p in a.problems]
    every = [x for _, xs, _ in groups for x in xs]
    if not every:
        return None
    fig, ax = _figure(7, 4)
    bins: Any = min(60, max(10, round(math.sqrt(len(every)) * 2)))
    lo, hi = min(every), max(every)
    if _log_if_wide(every):
        ax.set_xscale("log")
        bins = [lo * (hi / lo) ** (k / bins) for k in range(bins + 1)]
    elif hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    for label, xs, winner in groups:
        if not xs:
            continue
        *_, patches = ax.hist(xs, bins=bins, range=None if isinstance(bins, list) else (lo, hi),
                              histtype="stepfilled", alpha=0.45, label=f"{label} ({len(xs)})")
        if winner is not None:
            ax.axvline(winner.latency_ms, linestyle=":", color=patches[0].get_facecolor()[:3])
    ax.legend(title="problem (trials that worked); dotted: its winner", fontsize=8)
    ax.set(title=f"{a.name}: latency of the trials that worked, per problem (one pass)",
           xlabel="ms", ylabel="trials")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _plain(ax.xaxis)
    _plain(ax.yaxis)
    return fig


def _effects_by_problem(a: Analysis, varied: list[str]) -> Any:
    """Per parameter, a line per problem: the best latency of each value (one pass)."""
    import matplotlib.pyplot as plt

    cols = min(3, len(varied))
    rows = math.ceil(len(varied) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, varied):
        every = []
        for p in a.problems:
            e = next(e for e in p.effects if e.parameter == name)
            ms = [math.nan if v.best_ms is None else v.best_ms for v in e.values]
            every += [m for m in ms if not math.isnan(m)]
            ax.plot(range(len(ms)), ms, marker="o", label=p.label)
            labels = [json.dumps(v.value) for v in e.values]
        ax.set_xticks(range(len(labels)), labels)
        if _log_if_wide(every):
            ax.set_yscale("log")
        ax.set(title=name, ylabel="best ms")
        _plain(ax.yaxis)
    for ax in list(axes.flat)[len(varied):]:
        ax.axis("off")
    axes.flat[0].legend(title="problem", fontsize=8)
    fig.suptitle(f"{a.name}: best latency per parameter value, a line per problem "
                 "(one pass)", x=0.01, ha="left")
    fig.tight_layout()
    return fig


MAX_HEATMAPS = 12  # problems whose heatmap heatmap.png draws, the first ones


def _heatmaps_by_problem(a: Analysis, m: Heatmap) -> Any:
    import matplotlib.pyplot as plt

    shown = a.problems[:MAX_HEATMAPS]
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4 * rows), squeeze=False)
    for ax, p in zip(axes.flat, shown):
        mine = next(h for h in p.heatmaps if (h.x, h.y) == (m.x, m.y))
        _heat(fig, ax, mine, p.label)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    more = f" (the first {len(shown)} of {len(a.problems)} problems)" \
        if len(shown) < len(a.problems) else ""
    fig.suptitle(f"{a.name}: best latency (ms) by {m.x} and {m.y}, per problem{more}",
                 x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _problems(a: Analysis) -> Any:
    """The winner across problems: above, each tuned parameter whose winning value
    differs by problem (those whose values are numbers); below, the winner's latency
    (re-timed where it was)."""
    if not a.problems:
        return None
    import matplotlib.pyplot as plt

    labels = [p.label for p in a.problems]
    winners = [p.chosen for p in a.problems]
    lines = [k for k in a.winner_changes()
             if all(w is None or _number(w.config.get(k)) for w in winners)]
    fig, (top, low) = plt.subplots(2, 1, sharex=True, figsize=(max(6.0, 1.1 * len(labels)), 5.5),
                                   gridspec_kw={"height_ratios": [2, 1]})
    at = list(range(len(labels)))
    values = []
    for k in lines:
        ys = [math.nan if w is None else float(w.config[k]) for w in winners]
        values += [y for y in ys if not math.isnan(y)]
        top.plot(at, ys, marker="o", label=k)
    if values and min(values) > 0:
        top.set_yscale("log", base=2)
        top.set_yticks(sorted(set(values)), [significant(v) for v in sorted(set(values))])
        top.minorticks_off()
    if lines:
        top.legend(fontsize=8)
    else:
        top.text(0.5, 0.5, "the same config wins for every problem" if not a.winner_changes()
                 else f"{', '.join(a.winner_changes())} differ (not numbers)",
                 ha="center", va="center", transform=top.transAxes, color="#555555")
    top.set(ylabel="winning value",
            title=f"{a.name}: the winner across problems; its latency below")
    low.plot(at, [math.nan if w is None else w.best_ms for w in winners], marker="o",
             linestyle=":", color="#b8860b")
    low.set(ylabel="winner ms", xlabel=", ".join(a.problem_keys))
    low.set_ylim(bottom=0)
    low.set_xticks(at, labels)
    _plain(low.yaxis)
    fig.tight_layout()
    return fig


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
