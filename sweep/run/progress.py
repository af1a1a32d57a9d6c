"""Progress on stderr: a live rich bar on a terminal, a plain line every few seconds in a
log. Both are driver Observers (see sweep.run.driver.Observer).

The eta is the trials left at the recent rate, but never sooner than the configs still
compiling can end (CompileTail): at a sweep's tail the heaviest compiles run with no
trial finishing, and the rate of the light ones before them says nothing of those.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from actors.compile_limit import heavier
from actors.protocol import CompileLimit, compile_weight
from storage.records import TrialRecord
from sweep.console import printable
from sweep.results.tally import Tally
from sweep.search.scheduling import CACHE_HIT_MS, AdaptiveLimit

if TYPE_CHECKING:
    from sweep.run.driver import Driver

RATE_WINDOW_S = 60.0
MIN_RATE_TRIALS = 3
MIN_RATE_S = 2.0


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:.1f}/s" if task.speed else "-/s")


class _Eta(ProgressColumn):
    def __init__(self, reporter: ProgressReporter) -> None:
        super().__init__()
        self.reporter = reporter

    def render(self, task: Task) -> Text:
        left = self.reporter.eta_s()
        return Text("-:--:--" if left is None else time.strftime("%H:%M:%S", time.gmtime(left)))


class CompileTail:
    """How long the configs still compiling hold the run's end off, by the driver's clock:
    for each trial a worker holds and has not begun, its expected compile time less the
    time since it was sent; the longest of them. A config's expected compile time is the
    slowest seen of a config no heavier (compile_weight orders configs by how slowly they
    compile; one heavier than every config seen, the slowest seen), within the run's
    compile limit, which stops a compile past it; none for a config at least as heavy as
    one a learnt limit stopped, which its pool does not compile (actors/compile_limit.py;
    in a run of several workers only the stopping worker's pool does so: then an eta
    too soon by a limit's time at most)."""

    def __init__(self, driver: Driver, limit: AdaptiveLimit | None) -> None:
        self.driver, self.limit = driver, limit
        self._slowest: dict[float, float] = {}  # weight -> the slowest compile seen (s)
        self._ladder: tuple[list[float], list[float]] | None = None  # weights, running max
        self._stopped: list[dict[str, Any]] = []  # configs a learnt limit stopped

    def observe(self, records: Iterable[TrialRecord]) -> None:
        for r in records:
            if CompileLimit.stopped_learnt(r.status, r.error):
                self._stopped.append(self.driver.space.config(r.index))
            # A compile of under CACHE_HIT_MS found its binary cached: nothing learnt. One
            # stopped by the limit took at least what it records.
            if r.compile_ms is not None and r.compile_ms >= CACHE_HIT_MS:
                w = compile_weight(self.driver.space.kernel_config(r.index))
                self._slowest[w] = max(self._slowest.get(w, 0.0), r.compile_ms / 1e3)
                self._ladder = None

    def expected_s(self, weight: float) -> float:
        if not self._slowest:
            return 0.0
        if self._ladder is None:
            weights = sorted(self._slowest)
            peak, most = [], 0.0
            for w in weights:
                most = max(most, self._slowest[w])
                peak.append(most)
            self._ladder = weights, peak
        weights, peak = self._ladder
        at = bisect.bisect_right(weights, weight) - 1
        seconds = peak[max(at, 0)] if at >= 0 else min(self._slowest.values())
        return min(seconds, self.limit.current.seconds) if self.limit else seconds

    def remaining_s(self) -> float:
        now = self.driver.runtime.monotonic()
        by_weight: dict[float, float] = {}  # weight -> the earliest such trial was sent
        space = self.driver.space
        for slot in self.driver.pool.slots:
            for index, sent_at in slot.waiting():
                if self._stopped and any(heavier(space.config(index), s, space.problem_keys)
                                         for s in self._stopped):
                    continue  # it ends at once, uncompiled
                w = compile_weight(space.kernel_config(index))
                by_weight[w] = min(by_weight.get(w, sent_at), sent_at)
        return max((sent + self.expected_s(w) - now for w, sent in by_weight.items()),
                   default=0.0)


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
            TimeElapsedColumn(), TextColumn("eta"), _Eta(self),
            console=self.console, transient=False)
        self.tail: CompileTail | None = None
        self._ends_at: float | None = None  # when the eta says the run ends (monotonic)
        self._task = self._progress.add_task(describe(tally), total=self.total,
                                             completed=min(tally.done, self.total))

    def watching(self, driver: Driver, limit: AdaptiveLimit | None) -> Driver:
        """The eta counts the compiles this driver's workers still hold (CompileTail)."""
        self.tail = CompileTail(driver, limit)
        return driver

    def eta_s(self) -> float | None:
        """Seconds to the end as last estimated, counted down since; None: unknown."""
        return None if self._ends_at is None else max(0.0, self._ends_at - time.monotonic())

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
        rate = self.rate()
        if self.tail is not None:
            self.tail.observe(records)
        # Unknown until there is a rate; then never sooner than what still compiles.
        self._ends_at = None if not rate else now + max(
            (self.total - done) / rate, self.tail.remaining_s() if self.tail else 0.0)
        if not self.live and now - self._last_log >= self.log_every_s:
            self._last_log = now
            left = self.eta_s()
            eta = "?" if left is None else f"{left:.0f} s"
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
