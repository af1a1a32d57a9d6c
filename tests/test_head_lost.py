"""A single-node cluster whose head is killed mid-sweep: every process of the head (its
GCS server, raylet, the workers' processes) SIGKILLed at once, so the sweep's workers die
with it and the driver, replacing them, would start actors on a GCS that is gone. The
stop contract holds all the same: the driver ends within seconds with the table,
best.json and the snapshot written (`interrupted`), one line naming the lost head and the
resume command; `sweep resume` on a local Ray then finishes the run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, simulate_spec
from ray_nodes import RAY_ENV, Cluster, processes_of

from storage.snapshot import read_snapshot

pytestmark = pytest.mark.slow  # own Ray clusters: the slow tier

PORT = 6491  # of its own: other tests' clusters use 6450-6479 and 6488
STOP_BOUND_S = 15.0  # the contract's 10 s, and slack for a loaded 2-core machine
TOTAL, TRIAL_MS = 400, 50  # 2 workers: 10 s of trials, well past the kill


@pytest.fixture
def head(monkeypatch) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="hl-", dir="/tmp"))  # short: Unix socket paths
    # The head's record of itself goes under root, not /tmp/ray where others' runs look.
    monkeypatch.setenv("RAY_TMPDIR", str(root))
    c = Cluster(PORT, root=root)
    try:
        c.start_head(num_cpus=2)
        c.wait_alive(120)
        yield c
    finally:
        c.shutdown()


def journal_lines(run: Path) -> int:
    try:
        return (run / "journal.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_a_single_node_head_killed_mid_sweep_stops_within_the_bound_and_resumes(
        head, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": list(range(TOTAL))},
                         simulate={"trial_ms": TRIAL_MS},
                         run={"drain_s": 1, "snapshot_every_s": 1, "finalists": 0})
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", str(spec), "--out", str(run), "--address",
         head.address], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, env={**os.environ, **RAY_ENV})
    output: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=name, s=stream: output.__setitem__(n, s.read()),
                                daemon=True)
               for name, stream in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    try:
        deadline = time.monotonic() + 120
        while journal_lines(run) < 50:
            assert proc.poll() is None, f"the sweep ended ({proc.returncode}) first"
            assert time.monotonic() < deadline, "no 50 journal lines within 120 s"
            time.sleep(0.05)  # polling the journal, not a synchronisation by time
        # Every process of the head: its session's, and any naming its directory (the
        # workers), but not the driver, which opens Ray's log files there.
        doomed = [p for p in processes_of(head.root, {head.head.session}) if p != proc.pid]
        t_kill = time.monotonic()
        for p in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        try:
            code = proc.wait(timeout=STOP_BOUND_S + 5)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for r in readers:
            r.join(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    err, out = output.get("err", ""), output.get("out", "")
    said = f"exit {code} {took:.1f} s after the kill\nstdout:\n{out}\nstderr:\n{err[-3000:]}"
    assert code == 1, said  # docs/cli.md, Exit codes: a cluster whose head was lost, exit 1
    assert took < STOP_BOUND_S, said
    # Ray names the head by the address its GCS gave itself, which may be another of
    # this machine's than the loopback one joined.
    lost = [line for line in err.splitlines() if re.match(
        rf"error: the Ray cluster \(its head at \S+:{PORT}\) was lost: ", line)]
    assert len(lost) == 1 and lost[0].endswith(f"Resume with: sweep resume {run}"), said
    assert f"sweep resume {run}" in err, said
    assert "Traceback" not in err, said
    snap = read_snapshot(run / "snapshot.json")
    done = journal_lines(run)
    assert snap.state == "interrupted" and 0 < snap.done < TOTAL, (snap.state, snap.done)
    assert pq.read_table(run / "trials.parquet").num_rows == snap.done
    assert json.loads((run / "best.json").read_text())["partial"] is True

    # On this machine's local Ray (conftest: RAY_ADDRESS=local) the run finishes.
    resumed = subprocess.run([sys.executable, "-m", "sweep", "resume", str(run)], cwd=ROOT,
                             capture_output=True, text=True, timeout=180,
                             env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert resumed.returncode == 0, resumed.stderr
    rows = pq.read_table(run / "trials.parquet", columns=["index", "status"]).to_pylist()
    assert sorted(r["index"] for r in rows) == list(range(TOTAL))
    assert {r["status"] for r in rows} == {"ok"}
    assert read_snapshot(run / "snapshot.json").state == "complete"
    assert done <= journal_lines(run)
