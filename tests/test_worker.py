"""The worker's runner (actors/worker.py) against a compile pool the test controls: it runs
whichever config has compiled, announces each start, and runs configs itself while no
compile process is up yet. And adoption of a launcher started before the worker
(sweep/engines/prestart.py), with real processes and Triton's interpreter."""

from __future__ import annotations

import json
import os
import pickle
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pytest

from actors import child, worker
from actors.compiles import Compiled
from actors.launcher import Launcher
from actors.protocol import (
    Batch,
    BatchStarted,
    CompileLimit,
    Finished,
    Trial,
    TrialStarted,
    WorkerSettings,
)
from actors.worker import TrialWorker
from storage.records import TrialOutcome, TrialRecord, Where

SETTINGS = WorkerSettings(backend="simulate", kernel="matmul", problem={},
                          trial_timing=(1, 1), finalist_timing=(1, 1), tolerance=None, seed=0,
                          simulate={"trial_ms": 0, "fail_rate": 0, "crash_rate": 0,
                                    "hang_rate": 0, "seed": 0})


class ScriptedPool:
    """Compiles finish when the test says so (finish()); started() as the test sets it."""

    def __init__(self, up: bool = True, down: bool = False) -> None:
        self.up = up
        self.is_down = down
        self.submitted: list[int] = []
        self.finished: list[int] = []
        self.misses = 0
        self.changed = threading.Condition()

    def submit(self, key: int, config: Mapping[str, Any]) -> None:
        self.submitted.append(key)

    def hint(self, key: int, config: Mapping[str, Any]) -> None:
        pass

    def finish(self, key: int) -> None:
        with self.changed:
            self.finished.append(key)
            self.changed.notify_all()

    def take(self, keys: Iterable[int]) -> tuple[int, Compiled] | None:
        with self.changed:
            for key in keys:
                if key in self.finished:
                    self.finished.remove(key)
                    return key, Compiled(True, 1.0)
        return None

    def wait(self, timeout_s: float) -> None:
        with self.changed:
            self.changed.wait(timeout_s)

    def started(self) -> bool:
        return self.up

    def withdraw(self, key: int) -> bool:
        if key in self.submitted:
            self.submitted.remove(key)
            return True
        return False

    def set_limit(self, limit: CompileLimit) -> None:
        pass

    def notices(self) -> list[str]:
        return []

    def down(self) -> bool:
        return self.is_down

    def missed(self) -> None:
        self.misses += 1

    def close(self) -> None:
        pass


class RecordingBackend:
    device_name = "recording"

    def __init__(self) -> None:
        self.ran: list[tuple[int, Compiled | None]] = []

    def run_trial(self, config: Mapping[str, Any],
                  compiled: Compiled | None = None) -> TrialOutcome:
        self.ran.append((config["i"], compiled))
        return TrialOutcome("ok", "skipped", latency_ms=1.0, missed=config.get("missed", False))

    def retime(self, configs, rounds):  # pragma: no cover - not used here
        raise AssertionError


def make_worker(pool: ScriptedPool) -> tuple[TrialWorker, RecordingBackend]:
    backend = RecordingBackend()
    return TrialWorker(SETTINGS, "w1", parts=(backend, pool)), backend


def trials(*indices: int) -> list[Trial]:
    return [Trial(i, {"i": i}, 1) for i in indices]


def one_by_one(stream: Iterator[list[Any]]) -> Iterator[Any]:
    """A batch's messages one at a time, each record apart (the stream sends the messages
    ready at once together, and consecutive records as one Finished)."""
    for chunk in stream:
        assert chunk, "an empty message list was sent"
        for message in chunk:
            if isinstance(message, Finished):
                assert len(message.records) == len(message.lines)
                yield from message.records
            else:
                yield message


def test_the_config_compiled_first_runs_first_and_each_start_is_announced(monkeypatch):
    pool = ScriptedPool()
    w, backend = make_worker(pool)
    stream = one_by_one(w.run(Batch(0, trials(0, 1, 2))))
    pool.finish(2)  # configs 0 and 1 are still compiling
    first = [next(stream), next(stream), next(stream)]
    assert first[:2] == [BatchStarted(), TrialStarted(2, 0, ahead=True)]
    assert isinstance(first[2], TrialRecord) and first[2].index == 2
    pool.finish(1)
    pool.finish(0)
    rest = list(stream)
    assert rest[0] in (TrialStarted(0, 1, ahead=True), TrialStarted(1, 1, ahead=True))
    starts = [m for m in rest if isinstance(m, TrialStarted)]
    records = [m for m in rest if isinstance(m, TrialRecord)]
    assert [m.index for m in starts] == [r.index for r in records]
    assert sorted(r.index for r in records) == [0, 1] and len(starts) == 2
    assert all(compiled is not None for _, compiled in backend.ran)


def test_a_launch_that_missed_its_pools_binary_tells_the_pool_and_keeps_its_row():
    pool = ScriptedPool()
    w, _ = make_worker(pool)
    batch = [Trial(0, {"i": 0}, 1), Trial(1, {"i": 1, "missed": True}, 1)]
    pool.finish(0)
    pool.finish(1)
    records = [m for m in one_by_one(w.run(Batch(0, batch))) if isinstance(m, TrialRecord)]
    assert pool.misses == 1
    assert [(r.index, r.status) for r in records] == [(0, "ok"), (1, "ok")]
    assert "missed" not in records[1].to_json()  # the pool's to know, not the table's


def test_a_later_batch_runs_while_an_earlier_one_waits_on_a_compile(monkeypatch):
    pool = ScriptedPool()
    w, _ = make_worker(pool)
    first: list[object] = []
    reader = threading.Thread(target=lambda: first.extend(one_by_one(w.run(Batch(0, trials(0))))))
    reader.start()  # as Ray runs each batch's call on a thread of its own
    deadline = time.monotonic() + 120  # ends a hang only: room for a busy machine
    while not w._held:  # batch 0 is held, not compiled
        assert time.monotonic() < deadline, "batch 0 was never held"
        reader.join(0.01)
    second = one_by_one(w.run(Batch(1, trials(1))))
    pool.finish(1)
    assert next(second) == BatchStarted()
    assert next(second) == TrialStarted(1, 0, ahead=True)
    assert next(second).index == 1  # config 0 is still compiling
    assert first == []
    pool.finish(0)
    reader.join(120)
    assert [type(m) for m in first] == [BatchStarted, TrialStarted, TrialRecord]


def test_before_any_compile_process_is_up_the_worker_compiles_itself(monkeypatch):
    pool = ScriptedPool(up=False)
    w, backend = make_worker(pool)
    messages = list(one_by_one(w.run(Batch(0, trials(0, 1)))))
    records = [m for m in messages if isinstance(m, TrialRecord)]
    assert [r.index for r in records] == [0, 1]
    assert backend.ran == [(0, None), (1, None)]  # no result of the pool's: compiled inline
    assert pool.submitted == []  # and taken back from the pool's queue
    assert not any(m.ahead for m in messages if isinstance(m, TrialStarted))


# --- launchers started before their worker ----------------------------------------------
PAYLOAD = json.dumps({
    "kernel": "matmul", "kernel_path": "", "interpret": True, "seed": 0,
    "problem": {"M": 32, "N": 32, "K": 32, "dtype": "float16"},
    "trial_timing": (1, 3), "finalist_timing": (1, 3), "tolerance": (0.01, 0.05)})
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}


@pytest.fixture
def prestarted(tmp_path):
    address, key = str(tmp_path / "launcher"), secrets.token_hex(16)
    process = child.start_detached("actors.launcher:serve_prestarted", address, key, PAYLOAD,
                                   env={**os.environ, "TRITON_INTERPRET": "1"})
    yield address, key, process
    child.kill_process(process)


def test_a_worker_adopts_the_launcher_started_for_it(prestarted):
    address, key, process = prestarted
    launcher = Launcher(PAYLOAD, adopt=(address, key, process.pid))
    outcome = launcher.run_trial(CONFIG)
    assert (outcome.status, outcome.validation) == ("ok", "passed"), outcome
    assert launcher._child is not None and launcher._child.process.pid == process.pid


def test_a_launcher_that_cannot_be_adopted_is_replaced_by_the_workers_own(tmp_path):
    launcher = Launcher(PAYLOAD, adopt=(str(tmp_path / "nobody"), "00", 999999))
    assert launcher.run_trial(CONFIG).status == "ok"
    assert launcher._child is not None and launcher._child.process.pid != 999999
    child.kill(launcher._child)


def test_an_adopted_launcher_dies_with_the_worker_that_adopted_it(prestarted):
    address, key, process = prestarted
    adopter = subprocess.Popen([sys.executable, "-c", (
        "import sys; from actors.launcher import Launcher; "
        f"l = Launcher(sys.argv[1], adopt=({address!r}, {key!r}, {process.pid})); "
        "print(l.wait_ready(), flush=True); sys.stdin.read()"), PAYLOAD],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert adopter.stdout.readline().strip() == "cpu-interpreter"  # adopted and served
    adopter.send_signal(signal.SIGKILL)
    adopter.wait()
    # It noticed (its watch looks every 0.2 s), not never; the bound leaves a busy
    # machine room to end a process that holds torch.
    assert process.wait(timeout=60) == 0


def test_a_failure_on_a_batchs_last_trial_ends_that_batchs_stream(monkeypatch):
    # The batch leaves the worker's holdings when its last trial is taken; a failure while
    # running that trial must still reach its stream, or the driver waits on it for ever.
    pool = ScriptedPool()
    w, backend = make_worker(pool)

    def broken(config, seed, compiled=None):
        raise RuntimeError("the launching process failed to start")

    backend.run_trial = broken
    pool.finish(0)
    ended: list[BaseException] = []

    def read() -> None:
        try:
            list(w.run(Batch(0, trials(0))))
        except RuntimeError as e:
            ended.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the batch's stream never ended"
    assert "failed to start" in str(ended[0])


def test_before_its_pool_is_up_the_worker_compiles_the_likely_quickest_config_first(
        monkeypatch):
    pool = ScriptedPool(up=False, down=True)  # a pool that cannot start: all compile here
    w, backend = make_worker(pool)
    big, small = {"i": 0, "BLOCK": 256, "num_stages": 4}, {"i": 1, "BLOCK": 16, "num_stages": 2}
    list(w.run(Batch(0, [Trial(0, big, 1), Trial(1, small, 1)])))
    assert [i for i, _ in backend.ran] == [1, 0]  # the small tile first, not the order sent


def test_a_heavy_config_waits_for_the_pool_rather_than_compile_where_no_limit_stops_it(
        monkeypatch):
    # On an H200 a 32x8192 tile with 2 warps compiled in the launching process for the
    # whole of the trial's 60 s timeout (its compile is minutes), and the driver ended the
    # worker; in the pool the compile limit stops it.
    pool = ScriptedPool(up=False)
    w, backend = make_worker(pool)
    big, small = {"i": 0, "BLOCK": 8192, "ROWS": 32}, {"i": 1, "BLOCK": 2048, "ROWS": 1}
    stream = one_by_one(w.run(Batch(0, [Trial(0, big, 1), Trial(1, small, 1)])))
    assert next(stream) == BatchStarted()
    assert next(stream) == TrialStarted(1, 0, ahead=False)
    assert next(stream).index == 1
    assert backend.ran == [(1, None)] and pool.submitted == [0]  # the big one is the pool's
    pool.up = True
    pool.finish(0)
    assert next(stream) == TrialStarted(0, 1, ahead=True)
    assert next(stream).index == 0 and backend.ran[1][1] is not None


def test_records_finished_together_travel_as_one_message_and_pickle_as_values():
    def finished(index: int) -> Finished:
        record = TrialRecord.from_outcome(
            index, {"i": index}, TrialOutcome("ok", "passed", latency_ms=0.5 + index),
            where=Where("d", "n", "w1"), attempt=1, started_at=1.0, finished_at=2.0)
        return Finished((record,), (f"line {index}\n".encode(),))

    chunk = worker._Chunk()
    added = [chunk.add(m) for m in (BatchStarted(), finished(0), finished(1),
                                    TrialStarted(2, 0), finished(2))]
    assert added == [0, 1, 1, 0, 1]
    messages = chunk.messages()
    assert [type(m) for m in messages] == [BatchStarted, Finished, TrialStarted, Finished]
    assert [r.index for r in messages[1].records] == [0, 1]
    assert messages[1].lines == (b"line 0\n", b"line 1\n")
    back = pickle.loads(pickle.dumps(messages[1]))
    assert back == messages[1]  # every field, through the values-only form
    assert back.records[1].to_json() == messages[1].records[1].to_json()


def test_a_kernel_whose_import_breaks_forked_compile_processes_kills_no_worker(monkeypatch):
    # The real pool on a kernel whose import leaves forks unable to use the device (as
    # Liger-Kernel's does with CUDA): its forks die at start-up. That once raised out of
    # the pool and failed every batch the worker held, so the driver replaced a healthy
    # worker every few seconds; now the pool starts processes of their own and says so.
    from pathlib import Path

    from actors.compile_pool import CompileJob, CompilePool

    tests_dir = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # One process: how many a pool has is not what this checks (test_compile_pool.py's
    # forks that cannot start do), and each that starts on its own imports torch.
    pool = CompilePool(1, CompileJob("fork_unsafe_kernel:KERNEL_INIT",
                                     {"M": 64, "N": 64, "K": 64, "dtype": "float16"}),
                       CompileLimit(60))

    class FirstTrialOutlastsPoolStart(RecordingBackend):
        """Trials as long as a heavy config's: the first ends once the pool's processes
        have come up (or the pool is down), as a kernel's first trial outlasts the
        server's imports on a GPU."""

        def run_trial(self, config, compiled=None):
            deadline = time.monotonic() + 120
            while not pool.started() and getattr(pool, "_down", None) is None:
                assert time.monotonic() < deadline, "the pool never settled"
                pool.wait(0.05)
            return super().run_trial(config, compiled)

    backend = FirstTrialOutlastsPoolStart()
    w = TrialWorker(SETTINGS, "w1", parts=(backend, pool))
    try:
        configs = [Trial(i, {**CONFIG, "BLOCK_N": 16 * (i + 1), "i": i}, 1) for i in range(4)]
        messages = list(one_by_one(w.run(Batch(0, configs))))
    finally:
        pool.close()
    records = [m for m in messages if isinstance(m, TrialRecord)]
    assert sorted(r.index for r in records) == [0, 1, 2, 3]
    notes = [m.text for m in messages if isinstance(m, worker.Note)]
    assert len(notes) == 1 and "Cannot re-initialize CUDA in forked subprocess" in notes[0]
