"""The local runtime for real: worker processes of this machine, killed with real signals,
and the engine's choice between local and Ray. (The driver's rules over any runtime are in
tests/test_driver.py; whole runs on both runtimes in tests/test_stop_resume.py.)"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import ROOT, simulate_spec, sweep_proc

from actors.protocol import Trial, WorkerSettings
from sweep.engines import machine
from sweep.engines import selection as engines
from sweep.engines.local_runtime import LocalRuntime
from sweep.engines.runtime import (
    BatchDone,
    Placement,
    RetimeAbandoned,
    TrialsDone,
    WorkerLost,
    WorkerUp,
)
from sweep.spec import SpecError


def settings(**simulate) -> WorkerSettings:
    return WorkerSettings(
        backend="simulate", kernel="matmul", problem={}, trial_timing=(0, 1),
        finalist_timing=(0, 1), tolerance=None, seed=0,
        simulate={"trial_ms": 5, "fail_rate": 0.0, "crash_rate": 0.0, "hang_rate": 0.0,
                  "seed": 0, **simulate}, run="f" * 16)


@contextlib.contextmanager
def running(*args, **kwargs) -> Iterator[LocalRuntime]:
    """A LocalRuntime whose workers all end with the block."""
    runtime = LocalRuntime(*args, **kwargs)
    try:
        yield runtime
    finally:
        runtime.close()


def events_until(runtime: LocalRuntime, done, timeout: float = 120.0) -> list:
    """Events until done(events) holds (the state awaited, never a time span; the timeout
    only ends a test that hangs, so it leaves a busy machine's start-ups ample room)."""
    seen: list = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        assert time.monotonic() < deadline, f"not reached in time; saw {seen}"
        seen += runtime.poll(0.1)
    return seen


def pid_of(worker: str, runtime: LocalRuntime) -> int:
    return runtime._workers[worker].child.process.pid


def test_a_batch_sent_before_the_worker_is_up_runs_and_streams_every_record():
    with running(settings(), Placement(workers=1)) as runtime:
        runtime.start("w1")
        trials = [Trial(i, {"A": i}, 1) for i in range(50)]
        runtime.submit("w1", 0, trials, ())  # at once: the worker is not up yet
        seen = events_until(runtime, lambda ev: any(isinstance(e, BatchDone) for e in ev))
        assert any(isinstance(e, WorkerUp) for e in seen)
        done = [r.index for e in seen if isinstance(e, TrialsDone) for r in e.records]
        assert done == list(range(50))
        lines = [line for e in seen if isinstance(e, TrialsDone) for line in e.lines]
        assert all(line and b'"run":"ffffffffffffffff"' in line.replace(b" ", b"")
                   for line in lines)


def test_a_worker_killed_mid_batch_is_lost_with_how_it_ended_and_nothing_sent_is_lost():
    with running(settings(trial_ms=50), Placement(workers=1)) as runtime:
        runtime.start("w1")
        runtime.submit("w1", 0, [Trial(i, {"A": i}, 1) for i in range(200)], ())
        seen = events_until(runtime, lambda ev: sum(
            len(e.records) for e in ev if isinstance(e, TrialsDone)) >= 3)
        os.kill(pid_of("w1", runtime), signal.SIGKILL)
        seen += events_until(runtime, lambda ev: any(isinstance(e, WorkerLost) for e in ev))
        lost = [e for e in seen if isinstance(e, WorkerLost)]
        assert len(lost) == 1 and "killed by SIGKILL" in lost[0].why, lost
        assert not lost[0].init_failed
        done = [r.index for e in seen if isinstance(e, TrialsDone) for r in e.records]
        assert done == list(range(len(done))) and 3 <= len(done) < 200
        assert runtime.poll(0.0) == []  # nothing of it after its loss


def test_a_worker_that_dies_in_a_trial_is_lost_with_its_exit_code():
    with running(settings(crash_rate=1.0), Placement(workers=1)) as runtime:
        runtime.start("w1")
        runtime.submit("w1", 0, [Trial(0, {"A": 0}, 1)], ())
        seen = events_until(runtime, lambda ev: any(isinstance(e, WorkerLost) for e in ev))
        assert "exit code 17" in seen[-1].why


def test_a_worker_whose_start_up_raises_is_an_init_failure_in_one_line():
    bad = WorkerSettings(**{**settings().__dict__, "simulate": {"nonsense": 1}})
    with running(bad, Placement(workers=1)) as runtime:
        runtime.start("w1")
        seen = events_until(runtime, lambda ev: any(isinstance(e, WorkerLost) for e in ev))
        lost = seen[-1]
        assert lost.init_failed and "nonsense" in lost.why and "\n" not in lost.why


def test_re_timing_on_a_worker_that_dies_meanwhile_is_abandoned_not_hung():
    # Its re-timing would take 10 minutes: the kill lands during it however late a busy
    # machine runs the timer, and the wait ends with the death, not the 60 s limit.
    with running(settings(trial_ms=200_000), Placement(workers=1)) as runtime:
        runtime.start("w1")
        events_until(runtime, lambda ev: any(isinstance(e, WorkerUp) for e in ev))
        pid = pid_of("w1", runtime)
        killed: list[float] = []
        killer = threading.Timer(0.5, lambda: (os.kill(pid, signal.SIGKILL),
                                               killed.append(time.monotonic())))
        killer.start()
        try:
            with pytest.raises(RetimeAbandoned, match="killed by SIGKILL"):
                runtime.retime("w1", [{"A": 1}], 3, 60.0, lambda: False)
        finally:
            killer.cancel()
            killer.join()
        assert time.monotonic() - killed[0] < 30


def test_a_re_timing_given_up_never_answers_the_next_one():
    with running(settings(trial_ms=400), Placement(workers=1)) as runtime:
        runtime.start("w1")
        events_until(runtime, lambda ev: any(isinstance(e, WorkerUp) for e in ev))
        with pytest.raises(RetimeAbandoned, match="no answer within"):
            runtime.retime("w1", [{"A": 1}, {"A": 2}, {"A": 3}], 1, 0.1, lambda: False)
        # The first answer arrives while the second request waits: it is not taken.
        again = runtime.retime("w1", [{"A": 7}], 1, 30.0, lambda: False)
        assert len(again.finalists) == 1


def test_re_timing_on_a_worker_already_lost_is_abandoned_at_once_every_time():
    with running(settings(), Placement(workers=1)) as runtime:
        runtime.start("w1")
        events_until(runtime, lambda ev: any(isinstance(e, WorkerUp) for e in ev))
        os.kill(pid_of("w1", runtime), signal.SIGKILL)
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(RetimeAbandoned, match="was lost"):
                runtime.retime("w1", [{"A": 1}], 1, 60.0, lambda: False)
            assert time.monotonic() - started < 30  # half its limit: room for a busy machine
        lost = events_until(runtime, lambda ev: any(isinstance(e, WorkerLost) for e in ev))
        assert [type(e) for e in lost] == [WorkerLost]


def test_gpus_are_given_out_one_a_worker_and_back_when_it_is_killed():
    with running(settings(), Placement(workers=2, num_gpus=1),
                           gpus={"0": "H200", "1": "H200"}) as runtime:
        runtime.start("w1")
        runtime.start("w2")
        runtime.start("w3")  # no GPU left for it
        held = {runtime._workers[w].gpu for w in ("w1", "w2")}
        assert held == {"0", "1"}
        lost = events_until(runtime, lambda ev: any(isinstance(e, WorkerLost) for e in ev))
        assert [e.worker for e in lost if isinstance(e, WorkerLost)] == ["w3"]
        runtime.kill("w1")
        runtime.start("w4")
        assert runtime._workers["w4"].gpu in held


@pytest.mark.parametrize("asked, spec, address, env, head, expected", [
    (None, "auto", None, {}, False, "local"),
    (None, "auto", "127.0.0.1:6379", {}, False, "ray"),
    (None, "auto", None, {"RAY_ADDRESS": "10.0.0.1:6379"}, False, "ray"),
    (None, "auto", None, {}, True, "ray"),
    (None, "auto", "local", {}, False, "ray"),  # a private Ray instance, as before
    ("local", "auto", None, {"RAY_ADDRESS": "10.0.0.1:6379"}, True, "local"),
    (None, "ray", None, {}, False, "ray"),
    ("auto", "local", None, {}, True, "ray"),  # --runtime auto over the spec's local
    ("auto", "local", None, {}, False, "local"),
    ("ray", "local", None, {}, False, "ray"),
])
def test_the_runtime_is_local_unless_a_ray_cluster_is_named_or_found(
        monkeypatch, asked, spec, address, env, head, expected):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(machine, "ray_head_here", lambda *a, **k: "127.0.0.1:1" if head else None)
    assert engines.wanted(asked, spec, address) == expected


def test_a_local_runtime_with_an_address_is_refused_in_one_line():
    with pytest.raises(SpecError, match=re.escape("--address 10.0.0.1:6379: names a Ray")):
        engines.wanted("local", "auto", "10.0.0.1:6379")


def test_a_run_on_the_local_runtime_never_imports_ray(tmp_path):
    """Neither the CLI's nor the Python API's."""
    spec = simulate_spec(tmp_path / "spec.yaml", run={"finalists": 2})
    code = ("import sys; from sweep.cli import main; from sweep import api; "
            "code = main(['run', sys.argv[1], '--out', sys.argv[2]]); "
            "assert api.run(sys.argv[1], out=sys.argv[2] + '-api', quiet=True).complete; "
            "assert 'ray' not in sys.modules, 'ray imported'; sys.exit(code)")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", code, str(spec), str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "trials.parquet").exists()
    assert (tmp_path / "run-api" / "trials.parquet").exists()


def test_simulate_resources_on_the_local_runtime_are_refused_in_one_line(tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", simulate={"resources": {"sim_gpu": 1}})
    done = sweep_proc("run", spec, "--out", tmp_path / "run", "--runtime", "local")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {spec}: simulate.resources: asks Ray for resources, and this run's runtime "
        "is local (run.runtime: ray, or --address, runs it on Ray)"]
    assert not (tmp_path / "run").exists()


def test_auto_is_cuda_where_a_gpu_is_else_interpret_and_cuda_without_one_says_why():
    from dataclasses import replace

    from actors.backends import resolve
    from sweep.engines.local_engine import LocalEngine
    from sweep.spec import SpecError, load_spec

    spec = load_spec(ROOT / "configs" / "quickstart.yaml", import_kernel=False)
    asking = {b: replace(spec, run=replace(spec.run, backend=b)) for b in ("auto", "cuda")}
    engine = LocalEngine()
    engine._gpus = {}  # what the machine has, as gpus() found it
    assert engine.resolve_backend(asking["auto"]) == "interpret"
    with pytest.raises(SpecError, match=r"run\.backend: cuda, but this machine has no GPU"):
        engine.resolve_backend(asking["cuda"])
    engine._gpus = {"0": "H200"}
    assert engine.resolve_backend(asking["auto"]) == "cuda"
    assert [resolve(b, 0) for b in ("auto", "simulate", "cuda")] == \
        ["interpret", "simulate", "cuda"]
