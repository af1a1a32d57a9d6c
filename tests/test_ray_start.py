"""The private local Ray a run without an address starts, as a user meets it: a start that
times out is tried once more and, timing out again, is one line (exit 1, nothing written,
none of Ray's processes left running); a Ctrl+C or SIGTERM while Ray starts ends the
command within a second or so, not once Ray is up.

The failures are Ray's own, provoked through its settings: a GCS server given no time to
come up (RAY_gcs_server_port_wait_time_s), and one started through RAY_GCS_SERVER_VALGRIND
by a stand-in for valgrind that lets the first never start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, simulate_spec
from ray_nodes import descendants, processes_of

pytestmark = pytest.mark.slow  # own Ray clusters: the slow tier

# Stands in for valgrind, which Ray puts before the command of a process it starts with
# RAY_<TYPE>_VALGRIND=1: the first such process never starts, later ones run as they are.
FAKE_VALGRIND = """#!/bin/sh
while [ "${1#--}" != "$1" ]; do shift; done
if [ ! -e "$FAKE_VALGRIND_MARK" ]; then : > "$FAKE_VALGRIND_MARK"; exit 0; fi
exec "$@"
"""


@pytest.fixture
def ray_root() -> Iterator[Path]:
    """RAY_TMPDIR of the run's own Ray: short (Unix socket paths), and named by every
    process of it, which the checks below look for."""
    root = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def sweep(*args: object, root: Path, **env: str) -> subprocess.Popen:
    """`sweep run` in a session (so a process group) of its own, starting its own Ray."""
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local",
            "RAY_TMPDIR": str(root), **env}
    return subprocess.Popen([sys.executable, "-m", "sweep", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full, start_new_session=True)


def left_behind(proc: subprocess.Popen, root: Path, within_s: float = 5.0) -> list[int]:
    """Processes of the run's Ray still alive once the command has ended: in its session,
    or naming its Ray's directory. A killed process can take a moment to go."""
    deadline = time.monotonic() + within_s
    while (left := processes_of(root, {proc.pid})) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_local_start_that_times_out_twice_is_one_line(tmp_path, ray_root):
    spec = simulate_spec(tmp_path / "spec.yaml")
    proc = sweep("run", spec, "--out", tmp_path / "run", root=ray_root,
                 RAY_gcs_server_port_wait_time_s="0")
    out, err = proc.communicate(timeout=120)
    why = ("its GCS server did not come up within the 0 s that "
           "RAY_gcs_server_port_wait_time_s allows")
    lines = err.strip().splitlines()
    assert lines[0] == f"Ray's local start timed out: {why}; trying once more", err
    assert lines[1].startswith(
        f"error: Ray's local start timed out again: {why}; the machine may be too busy: try "
        "again when it is quieter, or start Ray once with `ray start --head`, which sweep "
        f"then joins; Ray's logs: {ray_root}/"), err
    assert (proc.returncode, len(lines), out) == (1, 2, ""), err
    assert not (tmp_path / "run").exists()
    assert left_behind(proc, ray_root) == []


def test_a_local_start_that_times_out_once_is_tried_again(tmp_path, ray_root):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "valgrind").write_text(FAKE_VALGRIND)
    (bin_dir / "valgrind").chmod(0o755)
    spec = simulate_spec(tmp_path / "spec.yaml", space={"A": [1, 2, 3]})
    proc = sweep("run", spec, "--out", tmp_path / "run", root=ray_root,
                 PATH=f"{bin_dir}:{os.environ['PATH']}", RAY_GCS_SERVER_VALGRIND="1",
                 FAKE_VALGRIND_MARK=str(tmp_path / "first-gcs-went"),
                 RAY_gcs_server_port_wait_time_s="10")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert ("Ray's local start timed out: its GCS server did not come up within the 10 s "
            "that RAY_gcs_server_port_wait_time_s allows; trying once more") in err
    assert "Traceback" not in err and "complete — 3 of 3 trials" in out
    assert left_behind(proc, ray_root) == []


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_local_ray_starts_ends_the_command_at_once(tmp_path, ray_root,
                                                                      signum, code):
    spec = simulate_spec(tmp_path / "spec.yaml")
    out = tmp_path / "run"
    proc = sweep("run", spec, "--out", out, root=ray_root)
    deadline = time.monotonic() + 60
    # The GCS server is the first process of Ray's start, seconds before it is up.
    while not any("gcs_server" in " ".join(_args(p)) for p in descendants(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    t0 = time.monotonic()
    # Ctrl+C signals the whole process group; SIGTERM comes from `kill PID`. (A SIGTERM to
    # the group also ends Ray's GCS before it writes its port, and ray.init waits out its
    # port wait in native code, where no handler runs: up to 30 s.)
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == code, err
    assert took < 15, f"{took:.1f} s"  # not the 30 s port wait; room for a busy machine
    assert "Traceback" not in err
    assert err.strip().endswith("stopped before the run started; nothing was written"), err
    assert not out.exists()
    assert left_behind(proc, ray_root) == []


def _args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
