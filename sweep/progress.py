"""Progress on stderr: a live rich bar on a terminal, a plain line every few seconds in a
log. Both are driver Observers (see sweep.driver.Observer)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from storage.records import TrialRecord
from sweep.tally import Tally


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:.1f}/s" if task.speed else "-/s")


def describe(tally: Tally) -> str:
    best = tally.best
    best_text = f"best {best.latency_ms:.4g} ms (#{best.index})" if best else "no best yet"
    return f"{tally.failed} failed · {best_text}"


class ProgressReporter:
    def __init__(self, tally: Tally, console: Console | None = None,
                 log_every_s: float = 10.0, expected: int | None = None) -> None:
        """expected: the trials the run will take at most, where a search runs fewer than
        the space holds (its budget); the bar and the eta count to that."""
        self.console = console or Console(stderr=True)
        self.total = min(expected, tally.total) if expected is not None else tally.total
        self.live = self.console.is_terminal
        self.log_every_s = log_every_s
        self._start = time.monotonic()
        self._done_at_start = tally.done
        self._last_log = 0.0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), _Rate(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, transient=False)
        self._task = self._progress.add_task(describe(tally), total=self.total,
                                             completed=min(tally.done, self.total))

    def __enter__(self) -> ProgressReporter:
        if self.live:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self._progress.stop()

    def on_records(self, records: list[TrialRecord], tally: Tally) -> None:
        done = min(tally.done, self.total)
        self._progress.update(self._task, completed=done, description=describe(tally))
        now = time.monotonic()
        if not self.live and now - self._last_log >= self.log_every_s:
            self._last_log = now
            rate = (tally.done - self._done_at_start) / max(now - self._start, 1e-9)
            left = self.total - done
            eta = f"{left / rate:.0f} s" if rate > 0 else "?"
            most = " at most" if self.total < tally.total else ""
            self.console.print(f"progress: {done}/{self.total}{most} done · {describe(tally)} "
                               f"· {rate:.1f}/s · eta {eta}", highlight=False)

    def on_event(self, message: str) -> None:
        self.console.print(f"[dim]{message}[/dim]", highlight=False)
