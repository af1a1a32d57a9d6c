"""The driver's rules (probation, timeouts, start-up failures, draining, budgets) against
an in-process runtime whose clock the test controls (tests/fake_runtime.py): each fault
path deterministically, in milliseconds. tests/test_stop_resume.py and
tests/test_statuses.py keep end-to-end runs with real Ray, real signals and real kills."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from fake_runtime import KILLED, Dies, Fails, FakeRuntime, Hangs, Ok, Start

from storage.records import TrialRecord
from sweep.results.tally import Tally
from sweep.run.contracts import DriverFailed, Limits, SpentAttempt, Work
from sweep.run.driver import Driver
from sweep.run.retiming import retime
from sweep.spec.space import expand

LIMITS = Limits(trial_timeout_s=60, max_retries=1, drain_s=3, snapshot_every_s=30,
                batch_size=2, depth=2, start_timeout_s=60)


@dataclass
class MemoryLog:
    records: list[TrialRecord] = field(default_factory=list)
    attempts: list[SpentAttempt] = field(default_factory=list)

    def commit(self, records: list[TrialRecord], attempts: list[SpentAttempt],
               lines: list[bytes | None]) -> None:
        self.records += records
        self.attempts += attempts

    def by_index(self) -> dict[int, TrialRecord]:
        assert len({r.index for r in self.records}) == len(self.records), "an index twice"
        return {r.index: r for r in self.records}


@dataclass
class Events:
    lines: list[str] = field(default_factory=list)

    def on_records(self, records, tally) -> None:
        pass

    def on_event(self, message: str) -> None:
        self.lines.append(message)


def make(n: int, runtime: FakeRuntime, limits: Limits = LIMITS, workers: int = 2,
         should_stop=lambda: False, todo=None, spent=None, deaths=None, kinds=(),
         compile_limit=None, feed=None, **driver_args):
    log, events = MemoryLog(), Events()
    space = expand({"A": list(range(n))}, [])
    work = Work(space, Tally(total=n), list(range(n)) if todo is None else todo, spent or {},
                deaths or {}, limits, workers, kinds, compile_limit, feed)
    driver = Driver(work, runtime, log, should_stop=should_stop, on_snapshot=lambda: None,
                    observers=[events], **driver_args)
    return driver, log, events


def test_every_trial_is_recorded_once_across_workers():
    rt = FakeRuntime()
    driver, log, _ = make(20, rt, workers=3)
    assert driver.run() == "complete"
    driver.close()
    rows = log.by_index()
    assert sorted(rows) == list(range(20))
    assert {r.status for r in rows.values()} == {"ok"}
    assert {r.worker for r in rows.values()} == {"w1", "w2", "w3"}
    assert driver.tally.done == 20 and log.attempts == []


def test_the_versions_each_device_types_workers_report_are_kept():
    # A cluster's head may run other torch and Triton builds than its GPU nodes: the
    # best-config cache keys each device's best by its workers' versions.
    rt = FakeRuntime()
    driver, _, _ = make(6, rt, workers=2, kinds=["SIM-A", "SIM-B"])
    assert driver.run() == "complete"
    driver.close()
    assert driver.pool.versions == {"SIM-A": {"torch": "torch-on-SIM-A"},
                               "SIM-B": {"torch": "torch-on-SIM-B"}}


def test_a_trial_that_kills_its_worker_runs_alone_then_is_crashed():
    rt = FakeRuntime(trial=lambda i, c, a, w: Dies() if i == 5 else Ok())
    driver, log, _ = make(12, rt)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert sorted(rows) == list(range(12))
    assert rows[5].status == "crashed" and rows[5].attempt == 2
    assert "died" in (rows[5].error or "")
    assert all(r.status == "ok" and r.attempt == 1 for i, r in rows.items() if i != 5)
    # The second death was on probation: trial 5 alone in its batch on a fresh worker.
    alone = [s for s in rt.submitted if 5 in s[2]]
    assert len(alone) == 2 and alone[1][2] == [5]
    assert rows[5].worker == alone[1][0]  # the worker it killed, not its replacement
    assert log.attempts == [SpentAttempt(5, 1, "died", KILLED), SpentAttempt(5, 2, "died", KILLED)]
    assert rows[5].error == f"its worker died: {KILLED}"


def test_a_suspect_blamed_for_a_death_it_did_not_cause_is_cleared_by_running_alone():
    # Trial 2's record is lost with its worker, which trial 3 killed: the driver first
    # suspects 2, which then succeeds alone; 3 is caught when it kills again.
    def trial(i, c, a, w):
        if i == 3:
            return Dies(lose_records=1)
        return Ok()

    rt = FakeRuntime(trial=trial)
    driver, log, _ = make(6, rt, limits=replace(LIMITS, batch_size=4, depth=1), workers=1)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert (rows[2].status, rows[2].attempt) == ("ok", 2)
    assert rows[3].status == "crashed"
    assert {i: r.status for i, r in rows.items() if i not in (2, 3)} == \
        dict.fromkeys((0, 1, 4, 5), "ok")


def test_a_replacement_worker_killed_while_starting_blames_no_trial():
    # Trial 4 kills its worker once (attempt 1 only). Its replacement is killed during
    # its own start-up, before it could run anything: that is not trial 4's death.
    starts = {"w2": Start(dies=True)}
    rt = FakeRuntime(trial=lambda i, c, a, w: Dies() if (i, a) == (4, 1) else Ok(),
                     start_script=lambda w: starts.get(w, Start()))
    driver, log, events = make(8, rt, workers=1)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert (rows[4].status, rows[4].attempt) == ("ok", 2)
    assert log.attempts == [SpentAttempt(4, 1, "died", KILLED)]
    assert f"worker w1 died running trial 4 (attempt 1): {KILLED}" in events.lines
    assert "worker w2 died while starting: killed while starting; starting another" in \
        events.lines


def test_a_hung_trial_is_recorded_timeout_and_its_worker_replaced():
    rt = FakeRuntime(trial=lambda i, c, a, w: Hangs() if i == 3 else Ok(seconds=2))
    driver, log, _ = make(10, rt)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert rows[3].status == "timeout" and "trial_timeout_s=60" in (rows[3].error or "")
    assert rows[3].finished_at - rows[3].started_at == pytest.approx(60, abs=0.3)
    assert all(r.status == "ok" for i, r in rows.items() if i != 3)
    assert rows[3].worker in rt.killed


def test_a_worker_frozen_between_batches_is_replaced_without_blaming_a_trial():
    # w1 finishes its first batch and never begins its second (a SIGSTOPped process).
    rt = FakeRuntime(freezes=lambda w, b: (w, b) == ("w1", 1))
    driver, log, events = make(10, rt, limits=replace(LIMITS, trial_timeout_s=5))
    assert driver.run() == "complete"
    rows = log.by_index()
    assert sorted(rows) == list(range(10))
    assert {r.status for r in rows.values()} == {"ok"} and log.attempts == []
    assert "w1" in rt.killed
    assert any("no progress for 5 s between batches" in line for line in events.lines)
    assert rt.now < 5 + 10  # replaced at its deadline, not never


def test_a_step_of_the_wall_clock_times_out_nothing():
    rt = FakeRuntime(trial=lambda i, c, a, w: Ok(seconds=1))

    class StepClock(Events):
        def on_records(self, records, tally) -> None:
            rt.wall_offset -= 7200  # the wall clock jumps back two hours, again and again

    driver, log, _ = make(10, rt, limits=replace(LIMITS, trial_timeout_s=3))
    driver.observers.append(StepClock())
    assert driver.run() == "complete"
    assert {r.status for r in log.records} == {"ok"}


def test_a_worker_that_cannot_be_placed_is_given_up_and_the_others_finish():
    rt = FakeRuntime(trial=lambda i, c, a, w: Ok(seconds=5),
                     start_script=lambda w: Start(never=True) if w == "w2" else Start())
    driver, log, events = make(6, rt, limits=replace(LIMITS, start_timeout_s=15))
    assert driver.run() == "complete"
    assert {r.worker for r in log.records} == {"w1"} and len(log.records) == 6
    assert any("did not start within run.start_timeout_s=15 s" in line for line in events.lines)


def test_a_worker_silent_after_its_last_record_keeps_no_run_waiting():
    # No worker's stream ends after its last record; every record still arrives.
    rt = FakeRuntime(hangs_after=lambda w, b: True)
    driver, log, _ = make(12, rt, limits=replace(LIMITS, batch_size=12, depth=1), workers=1)
    assert driver.run() == "complete"
    assert sorted(log.by_index()) == list(range(12))
    driver.close()
    assert rt.killed == ["w1"]


def test_a_slot_whose_workers_keep_failing_to_start_is_given_up_and_the_others_finish():
    rt = FakeRuntime(start_script=lambda w: Start() if w == "w1" else Start(init_fails=True))
    driver, log, events = make(8, rt)
    assert driver.run() == "complete"
    assert sorted(log.by_index()) == list(range(8)) and {r.worker for r in log.records} == {"w1"}
    assert any("failed to start 3 times" in line for line in events.lines)


def test_suspects_count_against_max_trials_too():
    rt = FakeRuntime()
    driver, log, _ = make(6, rt, limits=replace(LIMITS, max_trials=1), spent={0: 1, 1: 1},
                          deaths={0: 1, 1: 1})
    assert driver.run() == "budget"
    assert [r.index for r in log.records] == [0]


def test_a_timeout_while_draining_starts_no_new_worker():
    rt = FakeRuntime(trial=lambda i, c, a, w: Hangs() if i == 1 else Ok(seconds=1))
    stop = {"now": False}

    class StopAtFirst(Events):
        def on_records(self, records, tally) -> None:
            stop["now"] = True

    driver, log, _ = make(6, rt, limits=replace(LIMITS, batch_size=1, trial_timeout_s=2,
                                                drain_s=10), should_stop=lambda: stop["now"])
    driver.observers.append(StopAtFirst())
    assert driver.run() == "stopped"
    assert rt.started == ["w1", "w2"]  # the hung trial's worker was not replaced
    assert {r.index: r.status for r in log.records}[1] == "timeout"


def test_no_worker_starting_ends_the_run_failed():
    rt = FakeRuntime(start_script=lambda w: Start(never=True))
    driver, log, _ = make(4, rt, limits=replace(LIMITS, start_timeout_s=15))
    with pytest.raises(DriverFailed, match="no worker started within"):
        driver.run()
    assert rt.now == pytest.approx(15) and log.records == []


def test_workers_that_keep_failing_to_start_end_the_run_failed():
    rt = FakeRuntime(start_script=lambda w: Start(init_fails=True))
    driver, log, _ = make(4, rt, workers=1)
    with pytest.raises(DriverFailed, match="failed to start 3 times"):
        driver.run()
    assert rt.started == ["w1", "w2", "w3"] and log.records == []


def test_a_stop_drains_running_trials_and_abandons_batches_not_begun():
    rt = FakeRuntime(trial=lambda i, c, a, w: Ok(seconds=2 if i % 2 == 0 else 10))
    driver, log, _ = make(10, rt, limits=replace(LIMITS, batch_size=1, drain_s=3),
                          should_stop=lambda: rt.now >= 3)
    assert driver.run() == "stopped"
    # Both workers were up at t=1; batches are dealt: w1 runs [0] and [2] (2 s each), w2
    # [1] and [3] (10 s each). The stop comes at t=3, with trial 0's record, when w1 has
    # begun [2]: it finishes within the 3 s drain. Trial 1 would need until t=11: it spends
    # an attempt. Batch [3] was never begun: it simply runs again later.
    assert sorted(r.index for r in log.records) == [0, 2]
    assert log.attempts == [SpentAttempt(1, 1, "interrupted")]
    assert rt.now == pytest.approx(3 + 3)
    assert sorted(rt.killed) == ["w1", "w2"]


def test_max_trials_stops_handing_out_work_after_that_many():
    rt = FakeRuntime()
    driver, log, _ = make(20, rt, limits=replace(LIMITS, max_trials=7))
    assert driver.run() == "budget"
    assert len(log.records) == 7 and sorted(r.index for r in log.records) == list(range(7))
    assert sum(len(s[2]) for s in rt.submitted) == 7


def test_a_suspect_from_an_earlier_session_runs_alone_first():
    rt = FakeRuntime(trial=lambda i, c, a, w: Dies() if i == 1 else Fails())
    driver, log, _ = make(4, rt, workers=1, spent={1: 1}, deaths={1: 1})
    assert driver.run() == "complete"
    rows = log.by_index()
    assert (rows[1].status, rows[1].attempt) == ("crashed", 2)
    assert ("w1", 0, [0, 1]) not in rt.submitted
    assert [s[2] for s in rt.submitted if 1 in s[2]] == [[1]]


def test_retiming_after_a_resume_with_nothing_left_starts_one_worker():
    rt = FakeRuntime()
    driver, _, _ = make(3, rt, todo=[])
    assert driver.run() == "complete"
    timings = retime(driver.pool, [{"A": 0}, {"A": 1}], 3, lambda: False)
    assert len(timings.finalists) == 2 and rt.started == ["w1"]
    driver.close()
    assert rt.killed == ["w1"]


ANNOUNCED = replace(LIMITS, announced=True, compile_wait_s=20, trial_timeout_s=5)


def test_a_death_blames_the_trial_the_worker_announced_not_the_first_one_sent():
    # Workers with a compile pool run whichever config compiled first: here the second of
    # each batch. Trial 1 kills its worker every time.
    rt = FakeRuntime(order=lambda trials: trials[::-1],
                     trial=lambda i, c, a, w: Dies() if i == 1 else Ok())
    driver, log, _ = make(4, rt, limits=ANNOUNCED, workers=1)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert rows[1].status == "crashed"
    assert {rows[i].status for i in (0, 2, 3)} == {"ok"}
    assert {a.index for a in log.attempts} == {1}


def test_a_timeout_in_announced_order_is_recorded_on_the_announced_trial():
    rt = FakeRuntime(order=lambda trials: trials[::-1],
                     trial=lambda i, c, a, w: Hangs() if i == 1 else Ok())
    driver, log, _ = make(4, rt, limits=ANNOUNCED, workers=1)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert rows[1].status == "timeout" and {rows[i].status for i in (0, 2, 3)} == {"ok"}


def test_a_worker_that_waits_on_compiles_gets_the_compile_limit_before_it_is_replaced():
    # w1 never begins its first batch (its compiles never end, and nothing stops them):
    # nothing is announced, so no trial is blamed, and it is given the compile limit on
    # top of the trial timeout before it is replaced.
    rt = FakeRuntime(order=lambda trials: trials, freezes=lambda w, b: (w, b) == ("w1", 0))
    driver, log, events = make(4, rt, limits=ANNOUNCED, workers=1)
    assert driver.run() == "complete"
    assert {r.status for r in log.by_index().values()} == {"ok"} and log.attempts == []
    assert "w1" in rt.killed
    assert any("no progress for 25 s waiting on compiles" in line for line in events.lines)


def test_each_batch_carries_the_compile_limit_learnt_so_far():
    from sweep.search.scheduling import FACTOR, MIN_COMPILES, AdaptiveLimit

    rt = FakeRuntime(trial=lambda *_: Ok(compile_ms=2000.0))  # every compile took 2 s
    driver, _, _ = make(2 * MIN_COMPILES, rt, limits=replace(LIMITS, batch_size=4, depth=1),
                        workers=1, compile_limit=AdaptiveLimit(60.0, adaptive=True))
    assert driver.run() == "complete"
    assert rt.limits[0].seconds == 60.0 and rt.limits[0].median_s is None
    assert rt.limits[-1].seconds == FACTOR * 2.0 and rt.limits[-1].median_s == pytest.approx(2.0)


def test_a_compile_limit_learnt_while_nothing_is_left_to_send_reaches_the_workers_at_once():
    # A search sends nothing while it waits on a batch's outcomes: a compile hanging since
    # before the limit was learnt must hear of it without a new batch.
    from sweep.search.scheduling import FACTOR, MIN_COMPILES, AdaptiveLimit

    rt = FakeRuntime(trial=lambda *_: Ok(compile_ms=2000.0))
    driver, _, _ = make(MIN_COMPILES, rt, limits=replace(LIMITS, batch_size=MIN_COMPILES,
                                                         depth=1),
                        workers=1, compile_limit=AdaptiveLimit(60.0, adaptive=True))
    assert driver.run() == "complete"
    assert [limit.seconds for limit in rt.limits] == [60.0]  # the one batch's
    assert [(w, limit.seconds) for w, limit in rt.pushed] == [("w1", FACTOR * 2.0)]


def test_the_run_hears_once_that_a_workers_compile_pool_is_up():
    rt = FakeRuntime(order=lambda trials: trials)
    calls = []
    driver, _, _ = make(6, rt, limits=ANNOUNCED, on_compilers_up=lambda: calls.append(rt.now))
    assert driver.run() == "complete"
    assert calls == [1.0]  # at the first trial that began, and only then


def test_what_the_early_pool_compiled_teaches_the_compile_limit_once_the_pools_are_up():
    # Workers find the early pool's binaries in Triton's cache (compiles of ms): only the
    # early pool's own times can teach the limit, and they reach running compiles at once.
    from sweep.search.scheduling import FACTOR, MIN_COMPILES, AdaptiveLimit

    limit = AdaptiveLimit(60.0, adaptive=True)
    rt = FakeRuntime(order=lambda trials: trials, trial=lambda *_: Ok(compile_ms=2.0))
    driver, _, _ = make(6, rt, limits=ANNOUNCED, workers=1, compile_limit=limit,
                        on_compilers_up=lambda: limit.observe_compiles([1500.0] * MIN_COMPILES))
    assert driver.run() == "complete"
    assert [(w, round(lim.seconds, 1)) for w, lim in rt.pushed] == [("w1", FACTOR * 1.5)]


def test_a_death_whose_start_message_was_lost_still_makes_a_suspect_and_ends_crashed():
    # Trial 1 kills its worker before its start is announced, every time: without a
    # suspect it would go round forever.
    rt = FakeRuntime(order=lambda trials: trials,
                     trial=lambda i, c, a, w: Dies(lose_start=True) if i == 1 else Ok())
    driver, log, _ = make(4, rt, limits=ANNOUNCED, workers=1)
    assert driver.run() == "complete"
    rows = log.by_index()
    assert rows[1].status == "crashed" and {rows[i].status for i in (0, 2, 3)} == {"ok"}


def test_a_stop_awaits_the_trials_running_then_not_those_begun_after_it():
    stop = {"now": False}

    class StopAtFirstRecord(Events):
        def on_records(self, records, tally) -> None:
            stop["now"] = True

    rt = FakeRuntime(order=lambda trials: trials, trial=lambda *_: Ok(seconds=2))
    driver, log, _ = make(4, rt, limits=replace(ANNOUNCED, batch_size=4, drain_s=10),
                          workers=1, should_stop=lambda: stop["now"])
    driver.observers.append(StopAtFirstRecord())
    assert driver.run() == "stopped"
    # Up at t=1; trial 0 done at 3, when trial 1 begins: it is awaited (done at 5); trial
    # 2, begun at 5, is not: it spends an attempt and runs again on resume.
    assert sorted(r.index for r in log.records) == [0, 1]
    assert log.attempts == [SpentAttempt(2, 1, "interrupted")]
    assert rt.now == pytest.approx(5)


def test_trials_count_only_once_their_write_is_durable_and_a_failed_write_ends_the_run():
    # Writes overlap the loop (a thread makes each group durable); a trial must still
    # count only after its group's write returned, and a write that fails must end the
    # run rather than be lost on the thread.
    rt = FakeRuntime()
    written: list[int] = []
    counted_at_write: list[int] = []

    class SlowLog(MemoryLog):
        def commit(self, records, attempts, lines) -> None:
            counted_at_write.append(driver.tally.done)
            super().commit(records, attempts, lines)
            written.append(len(self.records))
            if len(written) == 6:
                raise OSError(28, "No space left on device")

    driver, _, _ = make(200, rt, limits=replace(LIMITS, batch_size=1), workers=4)
    driver.log = SlowLog()
    with pytest.raises(OSError, match="No space"):
        driver.run()
    # At each write, no more were counted than earlier writes had made durable.
    assert all(c <= w for c, w in zip(counted_at_write, [0, *written]))
    assert driver.tally.done <= written[-2]  # the failed group never counted


def test_a_stop_does_not_await_a_batch_an_in_order_worker_began_after_it():
    rt = FakeRuntime(trial=lambda i, c, a, w: Ok(seconds=2))
    driver, log, _ = make(4, rt, limits=replace(LIMITS, batch_size=1, drain_s=10), workers=1,
                          should_stop=lambda: rt.now >= 2)
    assert driver.run() == "stopped"
    # The stop came while trial 0 ran; trial 1's batch, queued behind it, began after.
    assert sorted(r.index for r in log.records) == [0]
    assert log.attempts == [SpentAttempt(1, 1, "interrupted")]


def test_a_stop_awaits_what_ran_when_it_came_not_what_began_after_until_its_time_is_up():
    from sweep.run.slots import Slot
    from sweep.run.workers import Drain

    drain = Drain(frozenset({("w1", 3)}), until=10.0)
    slot = Slot(name="w1", running=3)
    assert not drain.over([slot], announced=True, now=5.0)  # trial 3 still runs
    assert drain.over([slot], announced=True, now=10.0)  # run.drain_s is up
    slot.running = 4  # begun after the stop came: not awaited
    assert drain.over([slot], announced=True, now=5.0)


def test_an_overdue_slot_is_a_timed_out_trial_once_begun_and_a_stalled_worker_before():
    from sweep.engines.runtime import Trial
    from sweep.run.slots import HeldBatch, Slot, Stalled, TimedOut

    limits = Limits(trial_timeout_s=10, max_retries=1, drain_s=1, snapshot_every_s=60)
    batch = HeldBatch(0, [Trial(7, {"A": 1}, 2), Trial(8, {"A": 2}, 1)], started=True)
    slot = Slot(name="w1", batches=[batch], up=True, since=100.0)
    assert slot.verdict(limits, now=109.9) is None
    verdict = slot.verdict(limits, now=110.0)
    assert isinstance(verdict, TimedOut) and verdict.trial == Trial(7, {"A": 1}, 2)
    assert verdict.why.startswith("trial 7 ran past run.trial_timeout_s (10 s) on worker w1")
    assert verdict.error == ("no result within run.trial_timeout_s=10 s (the driver ended "
                             "its worker)")
    batch.started = False  # it finished a batch and never began this one
    stalled = slot.verdict(limits, now=110.0)
    assert isinstance(stalled, Stalled) and "between batches" in stalled.why
    # one that announces its trials and has none running waits on its compiles: their
    # limit is allowed on top of the trial's
    waiting = replace(limits, announced=True, compile_wait_s=5)
    assert slot.verdict(waiting, now=114.9) is None
    assert "waiting on compiles (run.trial_timeout_s 10 s + the compile limit 5 s)" in \
        slot.verdict(waiting, now=115.0).why
