"""A head started with `ray start --head` on this machine, where a token exists, runs with
token authentication (Ray 2.60): `sweep run` without --address joins it with the token
found here, RAY_AUTH_MODE unset, and says so in its first line; a wrong token is still
refused in one line. The head is started as a user does, with nothing but the token file
in its home (no RAY_AUTH_MODE): `ray start` turns token mode on itself."""

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
from ray_nodes import OBJECT_STORE_BYTES, RAY, await_head, processes_of

pytestmark = pytest.mark.slow  # own Ray clusters: the slow tier


@dataclass(frozen=True)
class Head:
    port: int
    token: str
    root: Path  # RAY_TMPDIR of the head and of the drivers that find it
    home: Path  # the head's HOME, with ~/.ray/auth_token

    def env(self, home: Path | None = None, **extra: str) -> dict[str, str]:
        """A user's environment on this machine: none of the test session's RAY_*
        (RAY_ADDRESS included), the head's home unless given another."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return {**env, "HOME": str(home or self.home), "RAY_TMPDIR": str(self.root),
                "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as held:  # all bound at once: n different ports
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    root = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))  # short: Unix socket paths
    home = root / "home"
    (home / ".ray").mkdir(parents=True)
    token = secrets.token_hex(32)
    (home / ".ray" / "auth_token").write_text(token)
    port, client_port, agent_port = _free_ports(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=str(root), RAY_USAGE_STATS_ENABLED="0", HOME=str(home))
    with open(root / "head.log", "wb") as log:
        proc = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--port", str(port), "--node-ip-address",
             "127.0.0.1", "--num-cpus", "1", "--include-dashboard", "false",
             "--ray-client-server-port", str(client_port),
             "--dashboard-agent-listen-port", str(agent_port),
             "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=root, start_new_session=True)
    try:
        await_head(proc, root, port)
        yield Head(port, token, root, home)
    finally:  # by pid: `ray stop` would end every cluster on the machine
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in processes_of(root, {proc.pid}):  # its session, or naming its directory
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def run(*args: str | Path, env: dict[str, str], timeout: float = 120
        ) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sweep", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    return proc, time.monotonic() - t0


def test_the_head_runs_with_token_authentication_as_its_gcs_environment_says(head):
    from sweep.engines.ray import tokens as cluster

    assert cluster._head_uses_token(f"127.0.0.1:{head.port}") is True
    assert cluster._head_uses_token("127.0.0.1:1") is None  # no such head: cannot tell


def test_a_head_started_here_is_joined_with_the_token_found_here(head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml")
    proc, _ = run("run", spec, "--out", tmp_path / "run", env=head.env())
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("joining the Ray cluster started on this machine at "), first
    assert first.endswith(f":{head.port} with the token in ~/.ray/auth_token "
                          "(--address local starts a private one instead)"), first
    assert pq.read_table(tmp_path / "run" / "trials.parquet").num_rows == 40


def test_a_token_named_by_ray_auth_token_path_is_the_one_sent(head, tmp_path):
    token = tmp_path / "cluster-token"
    token.write_text(head.token + "\n")
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": [1, 2, 3]})
    proc, _ = run("run", spec, "--out", tmp_path / "run",
                  env=head.env(tmp_path, RAY_AUTH_TOKEN_PATH=str(token)))  # home: none
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0].endswith(
        f":{head.port} with the token in {token} (RAY_AUTH_TOKEN_PATH) "
        "(--address local starts a private one instead)"), proc.stderr


def test_a_wrong_token_found_here_is_refused_in_one_line(head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml")
    proc, took = run("run", spec, "--out", tmp_path / "run",
                     env=head.env(tmp_path, RAY_AUTH_TOKEN="0" * 64))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr  # the first line, then the refusal's one
    assert lines[0].endswith(f":{head.port} with the token in RAY_AUTH_TOKEN "
                             "(--address local starts a private one instead)"), lines[0]
    assert lines[1].startswith("error: the Ray cluster found on this machine (`ray start`): "
                               "the Ray cluster at "), lines[1]
    assert lines[1].endswith(f":{head.port} uses token authentication and refused the token "
                             "in RAY_AUTH_TOKEN; use the cluster's token (`ray get-auth-token` "
                             "on the head prints it)"), lines[1]
    assert took < 15  # not Ray's 20 tries over 20 s; room for a busy start-up
    assert not (tmp_path / "run").exists()
