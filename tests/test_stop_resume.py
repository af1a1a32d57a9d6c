"""Stop and resume for real: signals sent to the CLI's process group at random moments,
SIGKILLs of the whole group, injected crashes and hangs; then `sweep resume` until the run
is complete, compared row by row with an uninterrupted run. (The driver's rules for each
fault are pinned down one by one, without Ray, in tests/test_driver.py.)

The signal tests run on both runtimes: the local one (worker processes of the CLI's own)
and, in the slow tier, Ray, where the CLI processes join the test session's Ray instance
(`--address`), as a resume against a running cluster does; tests/test_connect.py stops a
CLI starting its own. The rule tests run in this process, on the local runtime."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, simulate_spec, sweep_cli, sweep_in

from actors.simulate import draws

# Deterministic outcomes: compile errors, a crash, a hang; latencies fixed by the seed.
SPACE = {"A": list(range(12)), "B": list(range(10))}
SIM = {"workers": 3, "trial_ms": 20, "seed": 14, "fail_rate": 0.05, "crash_rate": 0.01,
       "hang_rate": 0.01}
RUN = {"trial_timeout_s": 2, "max_retries": 1, "drain_s": 1, "snapshot_every_s": 0.3}
COMPARED = ("index", "config", "status", "latency_ms", "latency_p20_ms", "latency_p80_ms",
            "validation")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The uninterrupted run everything else must reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    spec = simulate_spec(tmp / "spec.yaml", space=SPACE, simulate=SIM, run=RUN)
    assert sweep_cli("run", spec, "--out", tmp / "run") == 0
    rows = pq.read_table(tmp / "run" / "trials.parquet").to_pylist()
    statuses = {r["status"] for r in rows}
    assert {"ok", "compile_error", "crashed", "timeout"} <= statuses, statuses
    return rows


@pytest.fixture
def where(runtime_args) -> list[str]:
    """The runtime's arguments (conftest's runtime_args: local, then Ray joined)."""
    return runtime_args


def start(args: list, out: Path, joining: list[str]) -> subprocess.Popen:
    """The CLI in its own process group, as a shell runs a job; stderr goes to a file
    beside the run so a test can watch it while the process runs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    err = open(out.parent / "stderr.txt", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "sweep", *map(str, args), *joining], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def stderr_of(out: Path) -> str:
    return (out.parent / "stderr.txt").read_text()


def wait_until(condition, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Poll for an observable state of the run (a file, a line), never for a time span."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the sweep ended before the state was reached"
        assert time.monotonic() < deadline, "the state was not reached in time"
        time.sleep(0.02)


def has_records(out: Path) -> bool:
    journal = out / "journal.jsonl"
    return journal.exists() and journal.stat().st_size > 0


def run_or_resume(spec: Path, out: Path) -> list:
    # A stop during start-up, before run.json exists, leaves no run to resume.
    return ["resume", out] if (out / "run.json").exists() else ["run", spec, "--out", out]


def interrupt_then_finish(tmp_path: Path, sig: int, delays: list[float],
                          where: list[str]) -> list[dict]:
    """Interrupt runs at the given moments, then resume until complete."""
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE, simulate=SIM, run=RUN)
    out = tmp_path / "run"
    for delay in delays:
        before = {p.name: p.stat().st_size for p in out.iterdir()} if out.exists() else {}
        proc = start(run_or_resume(spec, out), out, where)
        time.sleep(delay)  # the random moment of the signal, not a synchronisation
        os.killpg(proc.pid, sig)
        stdout, _ = proc.communicate(timeout=120)
        stderr = stderr_of(out)
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        elif proc.returncode == -sig:
            # landed while Python itself was starting, before any handler could exist:
            # then nothing of ours ran, and nothing was written
            after = {p.name: p.stat().st_size for p in out.iterdir()} if out.exists() else {}
            assert after == before, stderr
        else:
            # finished before the signal landed, or stopped by it
            assert proc.returncode in (0, 128 + sig), stderr
            if proc.returncode == 128 + sig and (out / "run.json").exists():
                assert "resume with: sweep resume" in stdout, stdout
                best = json.loads((out / "best.json").read_text())
                snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
                if snap["state"] == "interrupted":
                    assert best["partial"] is True
    for _ in range(3):  # then resume until complete
        result = sweep_in(*run_or_resume(spec, out), *where)
        assert result.returncode == 0, result.stderr
        if "already complete" in result.stdout or "complete —" in result.stdout:
            break
    return pq.read_table(out / "trials.parquet").to_pylist()


def assert_same_as(reference: list[dict], rows: list[dict]) -> None:
    assert [r["index"] for r in rows] == list(range(len(reference)))  # each index once
    for ref, row in zip(reference, rows, strict=True):
        assert {k: row[k] for k in COMPARED} == {k: ref[k] for k in COMPARED}


def test_random_sigints_then_resume_equal_an_uninterrupted_run(reference, where, tmp_path):
    rng = random.Random(1)
    # one moment during start-up, one while trials run
    rows = interrupt_then_finish(tmp_path, signal.SIGINT,
                                 [rng.uniform(0.0, 1.5), rng.uniform(1.5, 3.0)], where)
    assert_same_as(reference, rows)


def test_random_sigkills_of_the_process_group_then_resume_equal_an_uninterrupted_run(
        reference, where, tmp_path):
    rng = random.Random(3)
    rows = interrupt_then_finish(tmp_path, signal.SIGKILL,
                                 [rng.uniform(1.5, 3.0), rng.uniform(1.0, 2.5)], where)
    assert_same_as(reference, rows)


@pytest.mark.slow  # seconds of 700 ms trials; SIGINT and SIGKILL stay in the default tier
def test_sigterm_stops_with_143_a_partial_best_and_cancelled_trials_run_again_as_attempt_2(
        where, tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", space={"A": list(range(6))},
                         simulate={"workers": 3, "trial_ms": 700},
                         run={**RUN, "drain_s": 0.1})
    out = tmp_path / "run"
    proc = start(["run", spec, "--out", out], out, where)
    wait_until(lambda: has_records(out), proc)  # the next trials are in flight now
    os.killpg(proc.pid, signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    best = json.loads((out / "best.json").read_text())
    table = pq.read_table(out / "trials.parquet")
    assert snap["state"] == "interrupted" and 0 < snap["done"] < 6
    assert table.num_rows == snap["done"]
    assert best["partial"] is True and best["latency_ms"] == snap["best"]["latency_ms"]
    assert f"resume with: sweep resume {out}" in stdout
    events = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    cancelled = {e["index"] for e in events}
    assert cancelled and {e["event"] for e in events} == {"interrupted"}
    assert sweep_cli("resume", out) == 0
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(6))
    assert {r["index"] for r in rows if r["attempt"] == 2} == cancelled
    assert all(r["attempt"] == 1 for r in rows if r["index"] not in cancelled)


def test_a_second_signal_exits_at_once_and_loses_no_acknowledged_trial(where, tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE,
                         simulate={"workers": 2, "trial_ms": 200, "hang_rate": 0.5, "seed": 1},
                         run={**RUN, "drain_s": 60, "trial_timeout_s": 60})
    out = tmp_path / "run"
    proc = start(["run", spec, "--out", out], out, where)
    wait_until(lambda: has_records(out), proc)
    os.killpg(proc.pid, signal.SIGINT)  # starts a 60 s drain: a hung trial never finishes
    wait_until(lambda: "draining" in stderr_of(out), proc)
    journal_before = (out / "journal.jsonl").read_bytes()
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    # At once: well inside the 60 s drain it cut short, with room for a busy machine.
    assert proc.returncode == 130 and time.monotonic() - t0 < 30
    assert "again: exiting now" in stderr_of(out)
    assert (out / "journal.jsonl").read_bytes().startswith(journal_before)


def test_resume_refuses_a_changed_spec_and_touches_nothing(tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE, simulate=SIM, run=RUN)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, "--max-trials", "10") == 0
    text = (out / "spec.yaml").read_text()
    (out / "spec.yaml").write_text(text.replace("seed: 14", "seed: 15"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert sweep_cli("resume", out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "changed since this run started" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_budgeted_runs_resume_to_the_same_table_with_each_index_once(reference, tmp_path,
                                                                      capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE, simulate=SIM, run=RUN)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, "--max-trials", "60") == 0
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    assert snap["state"] == "interrupted" and snap["done"] >= 60
    capsys.readouterr()
    assert sweep_cli("resume", out, "--max-trials", "30") == 0
    # The limit is this session's: 30 more, and the summary says so.
    again = json.loads((out / "snapshot.json").read_text())["snapshot"]["done"]
    assert again - snap["done"] >= 30 and again < 120
    assert f"--max-trials 30: this session ran {again - snap['done']} of them; each " \
        "session counts its own" in capsys.readouterr().out
    while sweep_cli("resume", out, "--max-trials", "60") == 0:
        snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
        if snap["state"] == "complete":
            break
    assert_same_as(reference, pq.read_table(out / "trials.parquet").to_pylist())


def test_damaged_snapshot_is_reported_and_the_run_rebuilt_from_the_journal(
        tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", simulate={"seed": 3})
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, "--max-trials", "15") == 0
    (out / "snapshot.json").write_text('{"snapshot": {"state": "runn')
    (out / "trials.parquet").unlink()  # as after a SIGKILL mid-run
    capsys.readouterr()
    assert sweep_cli("resume", out) == 0
    assert "snapshot.json: unreadable" in capsys.readouterr().err
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(40))
    assert [r["latency_ms"] for r in rows] == \
        [0.5 + draws(3, json.loads(r["config"]))[1] for r in rows]  # trial_ms 1


def test_only_a_complete_run_reaches_the_best_config_cache_unless_asked(
        tmp_path, monkeypatch, capsys):
    from storage.cache import lookup

    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "cache"))
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    assert sweep_cli("run", spec, "--out", tmp_path / "a", "--max-trials", "20") == 0
    assert lookup("matmul", "", {}) == []  # interrupted: not cached
    assert sweep_cli("resume", tmp_path / "a", "--max-trials", "20", "--cache-partial") == 0
    (entry,) = lookup("matmul", "", {})
    assert entry.partial is True and entry.backend == "simulate"
    assert sweep_cli("resume", tmp_path / "a") == 0
    (entry,) = lookup("matmul", "", {})
    best = json.loads((tmp_path / "a" / "best.json").read_text())
    assert entry.partial is False and entry.config == best["config"]
    assert entry.latency_ms == best["latency_ms"]
    capsys.readouterr()
    assert sweep_cli("best", spec) == 0
    listed = capsys.readouterr().out.splitlines()
    shown = json.loads(listed[0])
    assert (shown["latency_ms"], shown["run_dir"]) == \
        (best["latency_ms"], str((tmp_path / "a").resolve()))
    assert listed[1].startswith("triton.Config({")
