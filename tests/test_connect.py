"""Joining Ray never leaves the command deaf: an address where nothing listens is one
line within seconds, a signal while Ray is joining or starting is a clean stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ROOT, simulate_spec, sweep_proc

from storage.lock import LOCK_NAME


def start(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sweep", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def test_an_address_where_nothing_listens_is_one_line_within_seconds(tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml")
    t0 = time.monotonic()
    result = sweep_proc("run", spec, "--out", tmp_path / "run", "--address", "127.0.0.1:1",
                        timeout=60)
    # The line below says the probe answered; the bound, with room for a busy machine's
    # start-up, that no join was waited out (join.CONNECT_TIMEOUT_S is 30 s).
    assert time.monotonic() - t0 < 25
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --address: cannot reach a Ray cluster at 127.0.0.1:1 (Connection refused); "
        "is the head node up, and is that its GCS port (6379 by default)?")
    assert not (tmp_path / "run").exists()


class SilentServer:
    """Accepts connections and never answers, as a port that is not Ray's might."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_sigterm_while_ray_is_joining_a_silent_address_stops_at_once(tmp_path):
    server = SilentServer()
    spec = simulate_spec(tmp_path / "spec.yaml")
    try:
        proc = start("run", spec, "--out", tmp_path / "run", "--address",
                     f"127.0.0.1:{server.port}")
        deadline = time.monotonic() + 60
        while server.accepted < 1:  # the reachability probe: ray.init comes next
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        # Well before the 30 s a join is given (join.CONNECT_TIMEOUT_S), with room for
        # a busy machine's exit.
        assert time.monotonic() - t0 < 20
    finally:
        server.close()
    assert proc.returncode == 143, err
    assert "stopped while joining the Ray cluster; nothing was written" in err
    assert not (tmp_path / "run").exists()


def test_a_sigterm_while_the_local_ray_starts_is_a_clean_stop(tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml")
    out = tmp_path / "run"
    proc = start("run", spec, "--out", out, "--runtime", "ray")  # a private Ray instance
    deadline = time.monotonic() + 60
    while not (out / LOCK_NAME).exists():  # the run directory is claimed: Ray starts next
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "stopped before the run started; nothing was written" \
        in err
    assert not out.exists()


def test_the_project_root_is_where_ray_starts_its_workers():
    # Ray puts the driver's working directory first on every worker's sys.path.
    import sweep.engines.ray.cluster

    assert (sweep.engines.ray.cluster.NEUTRAL_DIR / "storage" / "journal.py").exists()
    cluster = sweep.engines.ray.cluster
    here = Path(cluster.NEUTRAL_DIR, "sweep", "engines", "ray", "cluster.py")
    assert here.samefile(cluster.__file__)
