"""Joining a running cluster as a user does: one started with `ray start` on this machine
is found without --address, and each way a join can fail (no token, a token Ray would not
send, a wrong token, other versions) is one line naming the cause and the fix, within
seconds, exit 2, nothing written. The cluster has token authentication on, as Ray 2.60's
`ray start` does once a token exists."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import simulate_spec
from ray_nodes import await_head, processes_of

pytestmark = pytest.mark.slow  # own Ray clusters: the slow tier

PORT = 6488  # of its own: other tests' clusters use 6450-6479
RAY = str(Path(sys.executable).with_name("ray"))


@dataclass(frozen=True)
class Head:
    address: str
    token: str
    root: Path  # RAY_TMPDIR of the head and of the drivers that find it

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """A user's environment on this machine: no RAY_* of the test session's, a home
        of its own (so no ~/.ray/auth_token unless a test puts one there)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return {**env, "HOME": str(home), "RAY_TMPDIR": str(self.root),
                "RAY_USAGE_STATS_ENABLED": "0", **extra}


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    root = Path(tempfile.mkdtemp(prefix="jt-", dir="/tmp"))  # short: Unix socket paths
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=str(root), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
               RAY_USAGE_STATS_ENABLED="0", HOME=str(root))
    with open(root / "head.log", "wb") as log:
        proc = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--port", str(PORT), "--node-ip-address",
             "127.0.0.1", "--num-cpus", "1", "--include-dashboard", "false",
             "--object-store-memory", str(80 << 20), "--disable-usage-stats"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await_head(proc, root, PORT)
        yield Head(f"127.0.0.1:{PORT}", token, root)
    finally:  # by pid: `ray stop` would end every cluster on the machine
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in processes_of(root, {proc.pid}):  # its session, or naming its directory
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def run(*args: str | Path, env: dict[str, str], timeout: float = 120,
        python: list[str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([*(python or [sys.executable, "-m", "sweep"]), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    return proc, time.monotonic() - t0


def test_a_cluster_started_on_this_machine_is_joined_without_an_address(head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml")
    proc, _ = run("run", spec, "--out", tmp_path / "run", env=head.env(
        tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token))
    assert proc.returncode == 0, proc.stderr
    assert "joining the Ray cluster started on this machine at " in proc.stderr
    assert f":{PORT} (--address local starts a private one instead)" in proc.stderr
    assert pq.read_table(tmp_path / "run" / "trials.parquet").num_rows == 40


def test_address_local_starts_a_private_instance_even_so(head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": [1, 2, 3]})
    proc, _ = run("run", spec, "--out", tmp_path / "run", "--address", "local",
                  env=head.env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "joining" not in proc.stderr


def test_the_clusters_token_given_as_readme_says_joins(head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": [1, 2, 3]})
    proc, _ = run("run", spec, "--out", tmp_path / "run", "--address", head.address,
                  env=head.env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("auth", "says"), [
    ({}, "uses token authentication and this machine has no token; set RAY_AUTH_MODE=token "
         "and RAY_AUTH_TOKEN to the cluster's token"),
    ({"RAY_AUTH_TOKEN": "TOKEN"}, "uses token authentication; a token is in RAY_AUTH_TOKEN, "
                                  "but Ray sends it only with RAY_AUTH_MODE=token: set that too"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
     "uses token authentication and refused the token in RAY_AUTH_TOKEN; use the cluster's "
     "token"),
    ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token, but this machine has no token "
                                 "(neither RAY_AUTH_TOKEN nor ~/.ray/auth_token holds one)"),
], ids=["no token", "no token mode", "wrong token", "token mode without a token"])
def test_a_join_the_cluster_refuses_is_one_line_naming_the_fix(head, tmp_path, auth, says):
    spec = simulate_spec(tmp_path / "s.yaml")
    auth = {k: head.token if v == "TOKEN" else v for k, v in auth.items()}
    proc, took = run("run", spec, "--out", tmp_path / "run", "--address", head.address,
                     env=head.env(tmp_path, **auth))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert lines[0].startswith("error: --address: "), proc.stderr
    assert took < 15  # not Ray's 20 tries over 20 s; room for a busy start-up
    assert not (tmp_path / "run").exists()


def test_other_versions_than_the_clusters_are_one_line(head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml")
    # This process claims another Ray version than the one the cluster runs.
    pretend = ("import sys, ray._private.utils as u; real = u.compute_version_info; "
               "u.compute_version_info = lambda: ('0.0.1', real()[1]); "
               "from sweep.command import main; sys.exit(main())")
    proc, took = run("run", spec, "--out", tmp_path / "run", "--address", head.address,
                     env=head.env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token),
                     python=[sys.executable, "-c", pretend])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"error: --address: the Ray cluster at {head.address} runs other "
                           "versions than this process (Version mismatch:")
    assert "Ray: 0.0.1" in line and line.endswith(
        "install the cluster's Ray and Python here, or run sweep on the head node")
    assert took < 30
    assert not (tmp_path / "run").exists()


def test_while_joining_rays_token_refusals_are_caught_and_other_lines_pass(tmp_path):
    # In a process of its own: the filter works on fd 2 itself.
    script = f"""
import os
from sweep.engines.ray.join import _RaysStderr
with _RaysStderr() as watch:
    for i in range(200):
        os.write(2, b"other line %d\\n" % i)
    os.write(2, b"[W] gcs_client.cc: InvalidAuthToken: Authentication token is missing\\n")
    while not watch.refused.is_set():
        pass
with open({str(tmp_path / "opened-after")!r}, "wb") as f:  # may reuse a closed fd number
    f.write(b"mine\\n")
print("refused")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout == "refused\n", proc.stderr
    assert proc.stderr.splitlines() == [f"other line {i}" for i in range(200)]
    assert (tmp_path / "opened-after").read_bytes() == b"mine\n"


def test_a_cluster_another_user_started_here_is_not_joined_and_the_run_says_why(
        tmp_path, monkeypatch):
    from sweep.engines.ray import join as cluster

    listener = socket.create_server(("127.0.0.1", 0))  # a head that answers
    record = tmp_path / "ray_current_cluster"
    record.write_text(f"127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setattr(cluster, "_address_file", lambda: record)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        assert cluster.target(None) == record.read_text()  # this user's: joined
        assert cluster.not_joined(None) is None
        os.chown(record, 54321, -1)  # the same record, another user's
        assert cluster.target(None) is None
        why = cluster.not_joined(None)
        assert why is not None and "started by another user (uid 54321" in why
        assert cluster.not_joined("local") is None  # asked for explicitly: nothing to say
    finally:
        listener.close()


def test_a_join_refused_names_what_gave_the_address(tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": [1]})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
           "RAY_ADDRESS": "127.0.0.1:9", "RAY_USAGE_STATS_ENABLED": "0"}
    proc, _ = run("run", spec, "--out", tmp_path / "run", env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: RAY_ADDRESS: cannot reach a Ray cluster at "
                                  "127.0.0.1:9"), proc.stderr
