"""Progress on stderr: a live rich bar on a terminal, a plain line every few seconds in a
log. Both are driver Observers (see sweep.run.driver.Observer)."""

from __future__ import annotations

import time
from collections import deque

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
from sweep.console import printable
from sweep.results.tally import Tally

RATE_WINDOW_S = 60.0
MIN_RATE_TRIALS = 3
MIN_RATE_S = 2.0


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:.1f}/s" if task.speed else "-/s")


def describe(tally: Tally) -> str:
    if tally.problems:  # a best across problems means nothing
        have = sum(1 for t in tally.problems if t.best is not None)
        return f"{tally.failed} failed · a best for {have} of {len(tally.problems)} problems"
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
        self._last_log = 0.0
        # (when, trials done) since the first record: the rate over the last RATE_WINDOW_S,
        # so that start-up (Ray, imports, the first compiles) is no part of it.
        self._seen: deque[tuple[float, int]] = deque()
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
        self._seen.append((now, tally.done))
        while len(self._seen) > 2 and now - self._seen[1][0] >= RATE_WINDOW_S:
            self._seen.popleft()
        if not self.live and now - self._last_log >= self.log_every_s:
            self._last_log = now
            rate = self.rate()
            eta = f"{(self.total - done) / rate:.0f} s" if rate else "?"
            most = " at most" if self.total < tally.total else ""
            rate_text = f"{rate:.1f}/s" if rate else "-/s"
            self._line(f"progress: {done}/{self.total}{most} done · {describe(tally)} "
                       f"· {rate_text} · eta {eta}")

    def rate(self) -> float | None:
        """Trials a second over the last RATE_WINDOW_S; None until there is enough to tell
        (MIN_RATE_TRIALS trials over MIN_RATE_S)."""
        (t0, n0), (t1, n1) = self._seen[0], self._seen[-1]
        if n1 - n0 < MIN_RATE_TRIALS or t1 - t0 < MIN_RATE_S:
            return None
        return (n1 - n0) / (t1 - t0)

    def on_event(self, message: str) -> None:
        self._line(message, style="dim")

    def _line(self, text: str, style: str = "") -> None:
        # Whole lines (a log is grepped, not read at 80 columns), and no markup: an error
        # text may hold brackets; a kernel's error or a problem's value, a terminal's escapes.
        self.console.print(Text(printable(text), style=style), highlight=False, soft_wrap=True)
