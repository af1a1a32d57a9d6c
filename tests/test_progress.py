"""Progress on stderr as a log shows it (not a terminal): whole lines, no markup read into
error texts, and a rate (and eta) only once there is something to tell it from."""

from __future__ import annotations

import io

from rich.console import Console

from storage.records import TrialOutcome, TrialRecord
from sweep.results.tally import Tally
from sweep.run import progress
from sweep.run.progress import ProgressReporter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(index: int) -> TrialRecord:
    return TrialRecord.from_outcome(
        index, {"A": index}, TrialOutcome("ok", "passed", latency_ms=1.0 + index),
        device="d", node="n", worker="w1", attempt=1, started_at=0.0, finished_at=1.0)


def reporter(monkeypatch, total: int) -> tuple[ProgressReporter, Tally, io.StringIO, Clock]:
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    sink = io.StringIO()
    tally = Tally(total=total)
    return ProgressReporter(tally, Console(file=sink, width=80), log_every_s=10), tally, \
        sink, clock


def test_a_log_gets_whole_lines_and_error_texts_keep_their_brackets(monkeypatch):
    rep, _, sink, _ = reporter(monkeypatch, 10)
    message = ("worker w2 died running trial 214 (attempt 1): it raised RuntimeError: "
               "[bold]tile[/bold] 32x8192 needs 262144 bytes of shared memory, "
               "the device has 232448; eta 4272 s stays on this line")
    rep.on_event(message)
    assert sink.getvalue() == message + "\n"


def test_no_eta_is_guessed_from_start_up_and_the_rate_comes_from_recent_trials(monkeypatch):
    rep, tally, sink, clock = reporter(monkeypatch, 1000)
    clock.now += 25  # Ray, imports, the first compiles: the first record comes late
    tally.add([record(0)])
    rep.on_records([record(0)], tally)
    first = sink.getvalue().splitlines()[-1]
    assert first.endswith("· -/s · eta ?"), first
    for i in range(1, 21):  # then two trials a second
        clock.now += 0.5
        tally.add([record(i)])
        rep.on_records([record(i)], tally)
    line = sink.getvalue().splitlines()[-1]
    assert line.startswith("progress: 21/1000 done"), line
    assert line.endswith("· 2.0/s · eta 490 s"), line
