"""A real multi-node Ray cluster on this machine (tests/ray_nodes.py): a head and worker
nodes, each its own `ray start` with its own hostname and simulated GPUs (`sim_gpu`), the
head with none, so every simulated worker runs on a worker node. A sweep joins it with
--address, as on a real cluster.

- A worker node whose raylet is killed mid-sweep: the sweep completes on the other node,
  every config exactly once, the dead node's in-flight trials run again there.
- The head killed mid-sweep: the driver exits within seconds with what it has (table and
  snapshot written, consistent with the journal), and `sweep resume` against a fresh
  cluster finishes the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, write_spec
from ray_nodes import RAY_ENV, Cluster

from storage.snapshot import read_snapshot

pytestmark = pytest.mark.slow  # own Ray clusters: the slow tier

SIM = {"sim_gpu": 1}  # what each simulated worker asks of its node
HEAD_LOST_BOUND_S = 25.0  # how long a driver may take to end after the head is killed


# --- helpers -----------------------------------------------------------------------------
def sim_spec(path: Path, configs: int, trial_ms: float, **run: object) -> Path:
    return write_spec(
        path, name="multinode", kernel="matmul",
        space={"A": list(range(configs // 10)), "B": list(range(10))},
        run={"backend": "simulate", "finalists": 0, "start_timeout_s": 60, **run},
        simulate={"workers": 4, "trial_ms": trial_ms, "resources": SIM})


class Sweep:
    """`python -m sweep ...` in its own process; stdout and stderr read line by line, each
    line stamped with when it arrived (monotonic)."""

    def __init__(self, *args: object) -> None:
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sweep", *map(str, args)], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env={**os.environ, **RAY_ENV})
        self.lines: list[tuple[float, str, str]] = []
        self._readers = [threading.Thread(target=self._read, args=(s, tag), daemon=True)
                         for s, tag in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for r in self._readers:
            r.start()

    def _read(self, stream, tag: str) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), tag, line.rstrip("\n")))

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running timeout_s later."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        for r in self._readers:
            r.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        for r in self._readers:
            r.join(5)

    def text(self, tag: str) -> str:
        return "\n".join(line for _, t, line in self.lines if t == tag)

    def since(self, t: float) -> list[str]:
        return [f"{when - t:+7.2f} s {tag}: {line[:300]}" for when, tag, line in self.lines
                if when >= t and "state-dump" not in line]


def journal(run: Path) -> list[dict]:
    """The journal's complete lines (a torn last line is not a record yet)."""
    try:
        data = (run / "journal.jsonl").read_bytes()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in data.split(b"\n")[:-1] if line]


def wait_for(what: str, done: Callable[[], bool], sweep: Sweep, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if sweep.proc.poll() is not None:
            sweep.wait(5)
            pytest.fail(f"the sweep ended ({sweep.proc.returncode}) before {what}:\n"
                        + "\n".join(sweep.since(sweep.t0)))
        if time.monotonic() >= deadline:
            pytest.fail(f"no {what} within {timeout_s:g} s:\n" + "\n".join(sweep.since(sweep.t0)))
        time.sleep(0.05)


def table_rows(run: Path) -> list[dict]:
    return pq.read_table(run / "trials.parquet").to_pylist()


def every_index_once(rows: list[dict], total: int) -> str | None:
    indices = sorted(r["index"] for r in rows)
    if indices != list(range(total)):
        missing = sorted(set(range(total)) - set(indices))
        doubled = sorted({i for i in indices if indices.count(i) > 1}) if \
            len(set(indices)) != len(indices) else []
        return (f"{len(indices)} rows for {total} configs; missing {missing[:10]}..., "
                f"doubled {doubled[:10]}")
    return None


# --- the clusters ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, Cluster]]:
    """Two clusters, started side by side (each test kills a node of its own): a head with
    no simulated GPU and two worker nodes with two each. GCS ports 6450 and 6460."""
    made = {"worker_death": Cluster(6450), "head_death": Cluster(6460)}
    try:
        assert all(c.own_hostnames for c in made.values()), \
            "these tests tell nodes apart by hostname: they need `unshare --uts` (root)"
        t0 = time.monotonic()
        for c in made.values():
            c.start_head({"sim_gpu": 0})
            c.add_worker("w1", {"sim_gpu": 2})
            c.add_worker("w2", {"sim_gpu": 2})
        for c in made.values():
            c.wait_alive(120)
        print(f"\ntwo clusters of head + 2 workers alive in {time.monotonic() - t0:.1f} s")
        yield made
    finally:
        errors = []
        for c in made.values():
            try:
                c.shutdown()
            except Exception as e:  # report every cluster's leftovers, not just the first
                errors.append(e)
        if errors:
            raise errors[0]


# --- a worker node dies ----------------------------------------------------------------------
def test_a_worker_node_killed_mid_sweep_its_trials_finish_on_the_other(clusters, tmp_path):
    c = clusters["worker_death"]
    total = 800
    spec = sim_spec(tmp_path / "spec.yaml", configs=total, trial_ms=20)
    run = tmp_path / "run"
    sweep = Sweep("run", spec, "--out", run, "--address", c.address)
    try:
        # An eighth of the trials are done, on both nodes: now kill one of them.
        def under_way() -> bool:
            rows = journal(run)
            return len(rows) >= total // 8 and {r["node"] for r in rows} >= {"mn-w1", "mn-w2"}

        wait_for("trials finished on both worker nodes", under_way, sweep, 90)
        raylet = c.node("w1").raylet_pid
        t_kill = time.monotonic()
        os.kill(raylet, signal.SIGKILL)
        before = len(journal(run))
        gone_s = c.wait_gone("w1", 30)
        gone_wall = time.time()  # no process of w1 is left to begin a trial
        code = sweep.wait(120)
        exit_s = time.monotonic() - t_kill
    finally:
        sweep.kill()
    log = "\n".join(sweep.since(sweep.t0))
    print(f"\nkilled w1's raylet at {before}/{total} trials; w1's processes all gone "
          f"{gone_s:.2f} s later; the sweep ended {exit_s:.1f} s after the kill")
    print("\n".join(sweep.since(t_kill)))
    assert code == 0, log
    assert before < total * 0.75, f"the sweep was nearly done when w1 was killed: {log}"

    rows = table_rows(run)
    assert every_index_once(rows, total) is None, every_index_once(rows, total)
    assert {r["status"] for r in rows} == {"ok"}, log
    nodes = {r["node"] for r in rows}
    assert nodes == {"mn-w1", "mn-w2"}, nodes
    late = {r["node"] for r in rows if r["started_at"].timestamp() > gone_wall}
    assert late == {"mn-w2"}, f"rows begun after w1 was gone name {late}"

    # What the driver says of the dead workers: each was running a trial, which ran again
    # (a second attempt) on the surviving node.
    died = [int(i) for i in re.findall(r"worker \w+ died running trial (\d+) \(attempt 1\): "
                                       r"its (?:process|node)", sweep.text("err"))]
    assert died, f"the driver said nothing of w1's workers dying:\n{log}"
    by_index = {r["index"]: r for r in rows}
    for i in died:
        assert (by_index[i]["node"], by_index[i]["attempt"]) == ("mn-w2", 2), by_index[i]
    first_death = next(t for t, _, line in sweep.lines if " died running trial" in line)
    print(f"the driver reported the first dead worker {first_death - t_kill:.2f} s after "
          f"the kill; in-flight trials {died} ran again on mn-w2")


# --- the head dies ---------------------------------------------------------------------------
def test_the_head_killed_mid_sweep_the_driver_ends_with_what_it_has_and_resume_finishes(
        clusters, tmp_path):
    """The head (its GCS server and raylet) is SIGKILLed while trials run on two worker
    nodes, which stay up (their raylets give the GCS 60 s to come back). Then: the driver
    ends within HEAD_LOST_BOUND_S, its table and snapshot readable and holding every trial
    of the journal, and `sweep resume` on a fresh cluster finishes the run. Failures are
    collected, so that one run shows every part that does not hold."""
    c = clusters["head_death"]
    total, trial_ms = 1400, 50  # 4 workers: 17.5 s of trials, more than the bound
    spec = sim_spec(tmp_path / "spec.yaml", configs=total, trial_ms=trial_ms, drain_s=1,
                    snapshot_every_s=1)
    run = tmp_path / "run"
    failures: list[str] = []
    # The cluster to resume on (GCS port 6470) starts meanwhile, unused until then.
    fresh = Cluster(6470)
    sweep = Sweep("run", spec, "--out", run, "--address", c.address)
    try:
        fresh.start_head({"sim_gpu": 0})
        fresh.add_worker("w1", {"sim_gpu": 4})
        wait_for("trials finishing", lambda: len(journal(run)) >= 80, sweep, 90)
        # "The head dies": its GCS server and its raylet, at once (`ray start --block`
        # ends the head's other processes within a second).
        gcs, raylet = c.head.gcs_pid, c.head.raylet_pid
        t_kill = time.monotonic()
        os.kill(gcs, signal.SIGKILL)
        os.kill(raylet, signal.SIGKILL)
        at_kill = len(journal(run))
        code = sweep.wait(HEAD_LOST_BOUND_S)
        exit_s = time.monotonic() - t_kill
        if code is None:
            failures.append(f"the driver was still running {HEAD_LOST_BOUND_S:g} s after the "
                            "head was killed (SIGKILLed by the test)")
            sweep.kill()
        elif code != 1:  # docs/cli.md, Exit codes: exit 1, with the resume command
            failures.append(f"the driver exited {code}, not 1, after the head was lost")
        print(f"\nkilled the head at {at_kill}/{total} trials; the driver "
              f"{'exited ' + str(code) if code is not None else 'was killed'} "
              f"{exit_s:.1f} s later, {len(journal(run))} trials in its journal")
        print("\n".join(sweep.since(t_kill)))
        # The old cluster's worker nodes would linger for a minute: end them now.
        c.shutdown()

        # What the driver left: readable, and all of it.
        done = {r["index"] for r in journal(run)}
        try:
            rows = table_rows(run)
            if {r["index"] for r in rows} != done:
                failures.append(f"trials.parquet holds {len(rows)} trials, the journal "
                                f"{len(done)}: the table was not written at the end")
        except Exception as e:
            failures.append(f"trials.parquet unreadable: {e}")
        try:
            snap = read_snapshot(run / "snapshot.json")
            if snap.state == "running" or snap.done != len(done):
                failures.append(f"snapshot.json: state {snap.state!r}, done {snap.done}; the "
                                f"journal holds {len(done)}: the snapshot was not written "
                                "at the end")
        except Exception as e:
            failures.append(f"snapshot.json unreadable: {e}")
        if code is not None and "sweep resume" not in sweep.text("out") + sweep.text("err"):
            failures.append(f"the driver (exit {code}) did not say how to resume:\n"
                            + "\n".join(sweep.since(t_kill)))

        # A fresh cluster finishes the run.
        fresh.wait_alive(120)
        t_resume = time.monotonic()
        resume = Sweep("resume", run, "--address", fresh.address)
        try:
            resumed = resume.wait(120)
        finally:
            resume.kill()
        print(f"sweep resume on a fresh cluster: exit {resumed} in "
              f"{time.monotonic() - t_resume:.1f} s, {total - len(done)} trials to run")
        if resumed != 0:
            failures.append(f"sweep resume exited {resumed}:\n"
                            + "\n".join(resume.since(resume.t0)))
        else:
            rows = table_rows(run)
            wrong = every_index_once(rows, total)
            if wrong or {r["status"] for r in rows} != {"ok"}:
                failures.append(f"after resume: {wrong or {r['status'] for r in rows}}")
            if read_snapshot(run / "snapshot.json").state != "complete":
                failures.append("after resume: the snapshot does not say complete")
    finally:
        sweep.kill()
        fresh.shutdown()
    assert not failures, "\n".join(failures)
