"""Interpreters started ahead of the processes they become (actors/spares.py): a spare of
the asked-for environment becomes the process, keeping what it printed while it waited;
one of another environment, or one that died, is passed over; one not taken ends."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from actors import child, spares
from actors import launcher as launcher_module
from actors.launcher import Launcher

BECOMES = "tests_spare_target:become"


@pytest.fixture
def env(tmp_path: Path):
    """An environment whose module, imported ahead, says so, and which, once a spare
    becomes it, writes its pid and its arguments."""
    (tmp_path / "tests_spare_target.py").write_text(textwrap.dedent("""
        import os, sys
        print("imported ahead", file=sys.stderr, flush=True)

        def ahead():
            print("called ahead", file=sys.stderr, flush=True)

        def become(path, word):
            print("became", word, file=sys.stderr, flush=True)
            with open(path, "w") as f:
                f.write(f"{os.getpid()} {word}")
        """))
    path = os.pathsep.join([str(tmp_path), *sys.path[1:]])
    yield {**os.environ, "PYTHONPATH": path}
    spares.end()


def test_a_spare_of_the_same_environment_becomes_the_process_keeping_what_it_printed(
        tmp_path, env):
    spares.start([env], imports=("tests_spare_target:ahead",))
    spare = spares._SPARES[0][1]
    log = tmp_path / "log"
    process = spares.become(BECOMES, str(tmp_path / "out"), "hello", env=env, out=str(log))
    assert process is spare
    assert process.wait(timeout=60) == 0
    assert (tmp_path / "out").read_text() == f"{spare.pid} hello"
    said = log.read_text().splitlines()  # in this order (an interpreter may warn besides)
    lines = [said.index(line) for line in ("imported ahead", "called ahead", "became hello")]
    assert lines == sorted(lines)
    assert spares.become(BECOMES, "x", "y", env=env, out=str(log)) is None  # taken once


def test_no_spare_is_taken_for_another_environment_and_end_ends_the_untaken(tmp_path, env):
    spares.start([env], imports=("tests_spare_target",))
    spare = spares._SPARES[0][1]
    other = {**env, "CUDA_VISIBLE_DEVICES": "1"}
    assert spares.become(BECOMES, "x", "y", env=other, out=str(tmp_path / "log")) is None
    assert child.alive(spare.pid)
    spares.end()  # killed, not awaited
    assert spare.wait(timeout=60) == -signal.SIGKILL


def test_a_spare_that_died_is_passed_over(tmp_path, env):
    spares.start([env, env], imports=())
    first, second = (process for _, process in spares._SPARES)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    log = tmp_path / "log"
    process = spares.become(BECOMES, str(tmp_path / "out"), "again", env=env, out=str(log))
    assert process is second  # the dead one was dropped, the next alive one taken
    assert process.wait(timeout=60) == 0
    assert (tmp_path / "out").read_text() == f"{second.pid} again"
    assert spares.become(BECOMES, "x", "y", env=env, out=str(log)) is None


class Skewed:
    """The time module, its monotonic clock `skew` seconds on."""

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skew

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def test_a_worker_adopts_a_launcher_whose_spare_is_still_importing(tmp_path, env,
                                                                   monkeypatch):
    """A spare makes the launcher's socket only once its imports are done, seconds after
    the worker begins to ask (5 s on a slow GPU host): the worker waits while it lives."""
    gate = tmp_path / "gate"
    (tmp_path / "tests_spare_gate.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n")
    spares.start([env], imports=("tests_spare_gate",))
    spare = spares._SPARES[0][1]
    address, key = str(tmp_path / "launcher"), secrets.token_hex(16)
    payload = ('{"kernel": "matmul", "kernel_path": "", "interpret": true, "seed": 0, '
               '"problem": {"M": 16, "N": 16, "K": 16, "dtype": "float32"}, '
               '"trial_timing": [1, 3], "finalist_timing": [1, 3], "tolerance": [0.01, 0.05]}')
    assert spares.become("actors.launcher:serve_prestarted", address, key, payload, env=env,
                         out=str(tmp_path / "log")) is spare
    asking = threading.Event()
    alive = child.alive
    clock = Skewed()

    def watched(pid: int) -> bool:
        if pid == spare.pid:
            asking.set()  # the worker is in its wait, with no socket to find
            clock.skew = 30.0  # and, by its clock, has waited 30 s
        return alive(pid)

    monkeypatch.setattr(child, "alive", watched)
    monkeypatch.setattr(launcher_module, "time", clock)
    launcher = Launcher(payload, adopt=(address, key, spare.pid))
    named: list[str] = []
    worker = threading.Thread(target=lambda: named.append(launcher.wait_ready()))
    worker.start()
    try:
        assert asking.wait(60) and not os.path.exists(address)
        gate.touch()  # the spare's imports end; it becomes the launcher
        worker.join(120)
        assert named == ["cpu-interpreter"]
        assert launcher._child is not None and launcher._child.process.pid == spare.pid
    finally:
        gate.touch()
        worker.join(120)
        child.kill_process(spare)
