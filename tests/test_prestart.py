"""What a local GPU run begins before Ray is up (sweep/engines/prestart.py), on a machine whose GPU
does not work (this one has none): its processes fail quietly into their own log, and
closing it leaves none of them running."""

from __future__ import annotations

import time

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
