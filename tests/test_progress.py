"""Progress on stderr as a log shows it (not a terminal): whole lines, no markup read into
error texts, a rate (and eta) only once there is something to tell it from, and an eta
that counts the compiles still running (against the driver tests' in-process runtime and
clock, tests/fake_runtime.py)."""

from __future__ import annotations

import io
from collections import deque

from fake_runtime import FakeRuntime, Ok
from rich.console import Console
from test_driver import MemoryLog

from actors.protocol import CompileLimit, compile_weight
from storage.records import TrialOutcome, TrialRecord, Where
from sweep.engines.runtime import Trial
from sweep.results.tally import Tally
from sweep.run import progress
from sweep.run.contracts import Limits, Work
from sweep.run.driver import Driver
from sweep.run.progress import CompileTail, ProgressReporter
from sweep.run.slots import HeldBatch, Slot
from sweep.search.scheduling import AdaptiveLimit
from sweep.spec.space import expand


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(index: int) -> TrialRecord:
    return TrialRecord.from_outcome(
        index, {"A": index}, TrialOutcome("ok", "passed", latency_ms=1.0 + index),
        where=Where("d", "n", "w1"), attempt=1, started_at=0.0, finished_at=1.0)


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


def test_the_eta_at_the_tail_counts_what_is_still_compiling(monkeypatch):
    """A config whose compile took 30 s is seen; then, with light trials ending fast, a
    heavier one is still compiling: the eta says the rest of its expected 30 s, not the
    light trials' rate."""
    slow, heavy = 19, (20, 21, 22)
    lights = [a for a in range(30) if a != slow and a not in heavy]

    def trial(index, config, attempt, worker):
        if config["A"] == slow:
            return Ok(seconds=31, compile_ms=30_000)
        if config["A"] in heavy:
            return Ok(seconds=40, compile_ms=39_000)
        return Ok(seconds=1, compile_ms=800)

    rt = FakeRuntime(trial=trial)
    sent: dict[int, float] = {}
    submit = rt.submit

    def noting(worker, batch, trials, ahead, limit=None):
        sent.update({t[0]: rt.now for t in trials})
        submit(worker, batch, trials, ahead, limit)

    rt.submit = noting  # type: ignore[method-assign]
    monkeypatch.setattr(progress.time, "monotonic", rt.monotonic)
    space = expand({"A": list(range(30))}, [])
    tally = Tally(total=30)
    rep = ProgressReporter(tally, Console(file=io.StringIO(), width=80), log_every_s=0)
    seen: list[tuple[float, float | None, float, float | None]] = []

    class Watch:
        def on_records(self, records, tally) -> None:
            # (now, the eta, the longest expected compile left, the rate's own guess)
            done.update(r.index for r in records)
            waiting = [sent[i] + 30 - rt.now for i in heavy if i in sent and i not in done]
            rate = rep.rate()
            seen.append((rt.now, rep.eta_s(), max(waiting, default=0.0),
                         (30 - tally.done) / rate if rate else None))

        def on_event(self, message: str) -> None:
            pass

    done: set[int] = set()
    limits = Limits(trial_timeout_s=120, max_retries=1, drain_s=3, snapshot_every_s=30,
                    batch_size=1, depth=1, start_timeout_s=60)
    work = Work(space, tally, [slow, *lights, *heavy], {}, {}, limits, 2)
    driver = rep.watching(Driver(work, rt, MemoryLog(), should_stop=lambda: False,
                                 on_snapshot=lambda: None, observers=[rep, Watch()]), None)
    assert driver.run() == "complete"
    driver.close()
    learnt = next(k for k, (now, *_) in enumerate(seen) if now >= 32)  # the slow one's record
    for now, eta, waiting, _ in seen[learnt:]:
        assert eta is not None and eta >= waiting, (now, eta, waiting)
    now, eta, waiting, by_rate = seen[learnt]
    # The light trials' rate alone said a few seconds; a heavy config sent at 27 s has
    # 25 s of its expected 30 s compile left.
    assert by_rate is not None and by_rate < 5 and waiting >= 24 and eta >= waiting
    # A terminal's bar shows the same eta, counted down between records.
    clock = rt.now
    rep._ends_at = clock + 95.0
    rt.now = clock + 20.0
    assert str(progress._Eta(rep).render(None)) == "00:01:15"  # type: ignore[arg-type]


def test_a_configs_expected_compile_is_the_slowest_seen_no_heavier_within_the_limit():
    space = expand({"A": list(range(50))}, [])
    rt = FakeRuntime()
    work = Work(space, Tally(total=50), [], {}, {}, Limits(60, 1, 3, 30), 1)
    tail = CompileTail(Driver(work, rt, MemoryLog(), should_stop=lambda: False,
                              on_snapshot=lambda: None), AdaptiveLimit(20.0, adaptive=False))
    def weight(a: int) -> float:
        return compile_weight({"A": a})

    assert tail.expected_s(weight(10)) == 0.0  # nothing seen: nothing to expect
    tail.observe([compiled(5, 2_000), compiled(10, 30_000), compiled(20, 4_000),
                  compiled(30, 10)])  # 10 ms: a cached binary, not a compile
    assert tail.expected_s(weight(2)) == 2.0  # lighter than all seen: the fastest seen
    assert tail.expected_s(weight(7)) == 2.0
    assert tail.expected_s(weight(25)) == 20.0  # 30 s seen lighter: the limit's 20
    assert tail.expected_s(weight(40)) == 20.0


def compiled(index: int, ms: float) -> TrialRecord:
    return TrialRecord.from_outcome(
        index, {"A": index}, TrialOutcome("ok", "passed", latency_ms=1.0, compile_ms=ms),
        where=Where("d", "n", "w1"), attempt=1, started_at=0.0, finished_at=1.0)


def test_a_config_heavier_than_one_a_learnt_limit_stopped_holds_no_eta_off():
    space = expand({"A": list(range(50))}, [])
    rt = FakeRuntime()
    work = Work(space, Tally(total=50), [], {}, {}, Limits(60, 1, 3, 30), 1)
    driver = Driver(work, rt, MemoryLog(), should_stop=lambda: False, on_snapshot=lambda: None)
    tail = CompileTail(driver, AdaptiveLimit(60.0, adaptive=True))
    learnt = CompileLimit(5.0, median_s=0.5, fixed_s=60.0)
    tail.observe([compiled(3, 4_000), compiled(6, 4_000), TrialRecord.from_outcome(
        10, {"A": 10}, TrialOutcome("timeout", "skipped", error=learnt.why(), compile_ms=5_000),
        where=Where("d", "n", "w1"), attempt=1, started_at=0.0, finished_at=1.0)])
    slot = Slot(name="w1", batches=deque([HeldBatch(0, [Trial(5, {}, 1), Trial(20, {}, 1)],
                                                    sent_at=rt.monotonic())]))
    driver.pool.slots.append(slot)
    # trial 20 (A 20 >= 10) is ruled out at once: only trial 5's 4 s hold the end off
    assert tail.remaining_s() == 4.0
    slot.batches[0].trials.pop(0)
    assert tail.remaining_s() == 0.0
    # a fixed limit's stop rules nothing out: then 20 is expected to take 5 s
    fixed = CompileTail(driver, AdaptiveLimit(60.0, adaptive=False))
    fixed.observe([TrialRecord.from_outcome(
        10, {"A": 10}, TrialOutcome("timeout", "skipped", error=CompileLimit(5.0).why(),
                                    compile_ms=5_000),
        where=Where("d", "n", "w1"), attempt=1, started_at=0.0, finished_at=1.0)])
    assert fixed.remaining_s() == 5.0
