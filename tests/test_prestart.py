"""What a local GPU run begins before Ray is up (sweep/engines/prestart.py), on a machine whose GPU
does not work (this one has none): its processes fail quietly into their own log, and
closing it leaves none of them running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import ROOT, write_spec

from actors import child
from actors.protocol import WorkerSettings
from sweep.engines.prestart import Prestart

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
    spec = write_spec(tmp_path / "s.yaml", name="k", kernel="matmul",
                      problem={"M": 16, "N": 16, "K": 16, "dtype": "float32"},
                      space={"BLOCK_M": [16], "BLOCK_N": [16], "BLOCK_K": [16],
                             "GROUP_M": [1]},
                      run={"backend": "interpret"})
    command = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", spec, "--out", tmp_path / "run", "--runtime",
         "local"], cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
