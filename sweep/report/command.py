"""`sweep report DIR`: the views a reader asked for, each from one analysis. Above every
view, so that no view imports another to be dispatched."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from sweep import EXIT_OK
from sweep.console import say, say_line
from sweep.report.analysis import analyse
from sweep.report.text import text_report
from sweep.spec import SpecError


def report(path: Path, top: int, out: Console, *, as_json: bool = False,
           html: Path | None = None, plot: Path | None = None) -> int:
    """`sweep report DIR`: the text report (or its JSON), and the HTML report and PNGs
    where asked. Every figure comes from sweep.report.analysis."""
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
        for line in text_report(analysis, top):  # each a line, whatever a run's text holds
            say_line(out, line)
    # With --json, where the files went goes to stderr: stdout stays one JSON document.
    tell = Console(stderr=True) if as_json else out
    for line in written:
        say(tell, line)
    return EXIT_OK
