"""What a local GPU run begins before Ray is up (sweep/engines/prestart.py), on a machine whose GPU
does not work (this one has none): its processes fail quietly into their own log, and
closing it leaves none of them running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, write_spec

from actors import child, spares
from actors.compile_pool import FORK_SAFE_ENV
from actors.protocol import FORKS, WorkerSettings
from sweep.engines import prestart
from sweep.engines.prestart import Prestart

# GPU id 0 stands for a GPU that does not work: on a machine with a real one, its
# launchers would come up and serve.
pytestmark = pytest.mark.skipif(any(Path("/dev").glob("nvidia[0-9]*")),
                                reason="needs a machine without a GPU")

SETTINGS = WorkerSettings(
    backend="cuda", kernel="matmul", problem={"M": 64, "N": 64, "K": 64, "dtype": "float16"},
    trial_timing=(1, 3), finalist_timing=(1, 3), tolerance=(0.01, 0.05), seed=0, simulate={})
CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}


def test_a_prestart_that_cannot_use_its_gpu_prints_nothing_and_leaves_no_process(
        monkeypatch, capfd):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a GPU id, with no GPU behind it
    prestart = Prestart.begin(SETTINGS, iter([(0, CONFIG)]))
    assert prestart is not None and list(prestart.launchers) == ["0"]
    launcher = prestart.processes[0]
    deadline = time.monotonic() + 60
    while launcher.poll() is None and time.monotonic() < deadline:  # it fails to set up CUDA
        time.sleep(0.05)
    assert launcher.returncode not in (None, 0)
    assert "Error" in (prestart.directory / "stderr.log").read_text()
    pool = prestart.pool
    assert pool is not None
    pids = [launcher.pid, pool._server.process.pid]
    prestart.close()
    assert not any(child.alive(pid) for pid in pids)
    assert not prestart.directory.exists()
    assert capfd.readouterr().err == ""  # its tracebacks went to its log, not the terminal


def one_config_run(tmp_path: Path, *options: str, env: dict[str, str],
                   size: int = 16) -> subprocess.Popen:
    """`sweep run` of one config under the interpreter, begun in the background."""
    spec = write_spec(tmp_path / "s.yaml", name="k", kernel="matmul",
                      problem={"M": size, "N": size, "K": size, "dtype": "float32"},
                      space={"BLOCK_M": [16], "BLOCK_N": [16], "BLOCK_K": [16],
                             "GROUP_M": [1]},
                      run={"backend": "interpret"})
    return subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", spec, "--out", tmp_path / "run", *options],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)


def processes_naming(folder: Path) -> list[int]:
    """The live processes whose command line names a path under folder."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and str(folder).encode() in \
                    (entry / "cmdline").read_bytes() and child.alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_a_command_killed_while_its_launchers_import_leaves_none_and_no_folder_after(
        tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    command = one_config_run(tmp_path, "--runtime", "local", env={"TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 120
        while not processes_naming(tmp):  # a launcher started: it is importing torch
            assert command.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)  # a poll interval: the command under test needs the cores
        os.kill(command.pid, signal.SIGKILL)
        command.wait()
        deadline = time.monotonic() + 120  # each launcher ends once it looks up
        while processes_naming(tmp):
            assert time.monotonic() < deadline, processes_naming(tmp)
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)
    left = list(tmp.glob("sweep-prestart-*"))
    assert len(left) == 1  # nobody was left to remove it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    prestart = Prestart.begin_interpret(SETTINGS, 1)  # the next start removes it
    try:
        assert not left[0].exists() and prestart.directory.exists()
    finally:
        prestart.close()
    assert list(tmp.iterdir()) == []


def a_dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def test_a_folder_whose_lock_is_free_is_removed_only_once_the_pid_in_its_name_is_dead(
        tmp_path, monkeypatch):
    # Its command made it a moment ago and has not taken its lock yet: it must stay.
    starting = tmp_path / f"sweep-prestart-{os.getpid()}-starting"
    starting.mkdir()
    (starting / ".owner").touch()  # free: nobody holds its lock
    gone = tmp_path / f"sweep-prestart-{a_dead_pid()}-gone"
    gone.mkdir()
    (gone / ".owner").touch()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prestart = Prestart.begin_interpret(SETTINGS, 1)
    try:
        assert starting.exists() and (starting / ".owner").exists()
        assert not gone.exists()
    finally:
        prestart.close()


@pytest.mark.parametrize("argv, started", [
    (["run", "s.yaml"], 3),  # two GPUs' launchers and the fork server
    (["run", "s.yaml", "--backend", "cuda", "--out", "r"], 3),
    (["run", "s.yaml", "--backend=interpret"], 0),
    (["run", "s.yaml", "--backend", "simulate"], 0),
    (["run", "s.yaml", "--address", "127.0.0.1:6379"], 0),  # workers on another machine
    (["run", "--help"], 0),
    (["resume", "r"], 0),  # a resumed run begins nothing early
    (["report", "r"], 0),
])
def test_spares_begin_for_a_run_whose_command_line_leaves_the_gpus_possible(
        monkeypatch, argv, started):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("SWEEP_PRESTART", raising=False)
    try:
        prestart.ahead(argv)
        envs = [env for env, _ in spares._SPARES]
    finally:
        spares.end()
    assert len(envs) == started
    if started:
        assert envs == [{**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
                        {**os.environ, "CUDA_VISIBLE_DEVICES": "1"},
                        {**os.environ, **FORK_SAFE_ENV}]


def test_no_spares_where_no_gpu_is_visible_or_prestarts_are_off(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    try:
        prestart.ahead(["run", "s.yaml"])
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        monkeypatch.setenv("SWEEP_PRESTART", "0")
        prestart.ahead(["run", "s.yaml"])
        assert spares._SPARES == []
    finally:
        spares.end()  # where it fails: none left to the tests after it


def test_a_prestart_takes_the_spares_begun_for_its_launcher_and_fork_server(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a GPU id, with no GPU behind it
    monkeypatch.delenv("SWEEP_PRESTART", raising=False)
    prestart.ahead(["run", "s.yaml"])
    ahead = [process.pid for _, process in spares._SPARES]
    begun = Prestart.begin(SETTINGS, iter([(0, CONFIG)]), adopted_pools=True)
    assert begun is not None
    try:
        assert spares._SPARES == []
        assert [begun.launchers[name][2] for name in ("0", FORKS)] == ahead
        launcher = begun.processes[0]
        assert launcher.wait(timeout=120) != 0  # it fails to set up CUDA, as a fresh one
        assert "Error" in (begun.directory / "stderr.log").read_text()
    finally:
        begun.close()
    deadline = time.monotonic() + 60  # killed, not awaited: each ends in a moment
    while any(child.alive(pid) for pid in ahead):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def spares_of(pid: int) -> list[int]:
    """The live spares (actors/spares.py) process pid started."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid and b"actors.spares" in (entry / "cmdline").read_bytes() \
                    and child.alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_a_command_killed_while_its_spares_import_leaves_none(tmp_path):
    command = one_config_run(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0"})
    try:
        deadline = time.monotonic() + 120
        while len(begun := spares_of(command.pid)) < 2:  # the launcher's and fork server's
            assert command.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)  # a poll interval: the command under test needs the cores
        os.kill(command.pid, signal.SIGKILL)
        command.wait()
        deadline = time.monotonic() + 120
        while any(child.alive(pid) for pid in begun):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)


def test_spares_a_run_does_not_take_are_ended_before_its_trials(tmp_path):
    trace = tmp_path / "trace.jsonl"
    # Seconds of the interpreter's work in its one trial: the run is still going.
    command = one_config_run(tmp_path, size=512, env={
        "CUDA_VISIBLE_DEVICES": "0", "SWEEP_TRACE": str(trace)})  # its spec: interpret

    def noted(event: str) -> list[int]:
        lines = trace.read_text().splitlines() if trace.exists() else []
        return [json.loads(line)["pid"] for line in lines if f'"{event}"' in line]

    try:
        deadline = time.monotonic() + 120
        while not noted("trial"):
            assert command.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)  # a poll interval
        begun = noted("spare_started")
        assert begun  # they began, and imported while the command went on
        while any(child.alive(pid) for pid in begun):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert command.poll() is None  # ended with the run still in its trial
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)
        command.wait()
