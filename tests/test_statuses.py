"""Each status, produced for real: Triton's interpreter for compile errors, wrong numbers
and errors while running; the simulate backend's dying and hanging workers for crashed
and timeout."""

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import simulate_spec, sweep_cli, sweep_in, sweep_proc, write_spec

from actors.simulate import draws

# The runs are the CLI in this process, on the local runtime, except where Ray is what a
# test checks.
LOCAL = ("--runtime", "local")


def test_real_triton_outcomes_map_to_their_statuses(tmp_path):
    spec = write_spec(tmp_path / "faulty.yaml", kernel="faulty",
                      problem={"n": 300}, space={"BLOCK": [64, 48], "MODE": [0, 1, 2]},
                      timing={"warmup_ms": 1, "rep_ms": 5},
                      run={"backend": "interpret", "trial_timeout_s": 60, "workers": 1,
                           "finalists": 0})
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *LOCAL) == 0
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    got = {(r["BLOCK"], r["MODE"]): (r["status"], r["validation"]) for r in rows}
    assert got == {
        (64, 0): ("ok", "passed"),
        (64, 1): ("incorrect", "failed"),
        (64, 2): ("runtime_error", "skipped"),
        (48, 0): ("compile_error", "skipped"),
        (48, 1): ("compile_error", "skipped"),
        (48, 2): ("compile_error", "skipped"),
    }
    by_key = {(r["BLOCK"], r["MODE"]): r for r in rows}
    assert by_key[(64, 0)]["latency_ms"] > 0 and by_key[(64, 0)]["error"] is None
    assert "max abs error" in by_key[(64, 1)]["error"]
    assert "ZeroDivisionError" in by_key[(64, 2)]["error"]
    assert "power of 2" in by_key[(48, 0)]["error"]
    assert all(r["latency_ms"] is None for r in rows if r["status"] != "ok")
    assert {r["device"] for r in rows} == {"cpu-interpreter"}


def test_validation_off_is_recorded_as_disabled_never_passed(tmp_path):
    spec = write_spec(tmp_path / "noval.yaml", kernel="faulty",
                      problem={"n": 100}, space={"BLOCK": [64], "MODE": [1]},
                      timing={"warmup_ms": 1, "rep_ms": 5}, validation="off",
                      run={"backend": "interpret", "workers": 1, "finalists": 0})
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *LOCAL) == 0
    (row,) = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert (row["status"], row["validation"]) == ("ok", "disabled")


def expected_status(config: dict, seed: int, fail: float, crash: float, hang: float) -> str:
    fate, _ = draws(seed, config)
    if fate < fail:
        return "compile_error"
    if fate < fail + crash:
        return "crashed"
    if fate < fail + crash + hang:
        return "timeout"
    return "ok"


def test_dying_and_hanging_workers_end_as_crashed_and_timeout_rows(tmp_path):
    rates = {"fail_rate": 0.1, "crash_rate": 0.15, "hang_rate": 0.1}
    spec = simulate_spec(tmp_path / "faults.yaml", space={"A": list(range(24))},
                         simulate={"seed": 1, **rates},
                         run={"trial_timeout_s": 1.5, "max_retries": 1})
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *LOCAL) == 0
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(24))
    expected = [expected_status(json.loads(r["config"]), 1, rates["fail_rate"],
                                rates["crash_rate"], rates["hang_rate"]) for r in rows]
    assert [r["status"] for r in rows] == expected
    assert {"crashed", "timeout", "ok", "compile_error"} <= set(expected)
    # A record sent just before a worker dies can be lost with it, so an innocent trial may
    # be suspected once: it then runs again alone (attempt 2) and its own outcome stands.
    deaths = Counter(json.loads(line)["index"] for line in
                     (tmp_path / "run" / "attempts.jsonl").read_text().splitlines())
    for r in rows:
        if r["status"] == "crashed":  # died on its first try and on its one retry
            assert r["attempt"] == deaths[r["index"]] == 2 and "died" in r["error"]
        else:
            assert r["attempt"] == 1 + deaths[r["index"]] and deaths[r["index"]] <= 1
        if r["status"] == "timeout":
            assert "trial_timeout_s=1.5" in r["error"]


def test_a_config_that_kills_the_launching_process_is_crashed_and_the_worker_goes_on(
        tmp_path):
    # MODE 3 stores terabytes out of bounds: under the interpreter the process launching
    # the kernel dies of a segmentation fault, for real.
    spec = write_spec(tmp_path / "segv.yaml", kernel="faulty", problem={"n": 100},
                      space={"BLOCK": [64], "MODE": [3, 0, 1]},
                      timing={"warmup_ms": 1, "rep_ms": 5},
                      run={"backend": "interpret", "workers": 1, "finalists": 0})
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *LOCAL) == 0
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [r["status"] for r in rows] == ["crashed", "ok", "incorrect"]
    assert "died on this config twice" in rows[0]["error"], rows[0]["error"]
    assert "SIGSEGV" in rows[0]["error"]
    # One worker throughout: the launcher was replaced, not the worker and its queue.
    assert len({r["worker"] for r in rows}) == 1 and {r["attempt"] for r in rows} == {1}


def crashing_sweep(tmp_path: Path) -> tuple[Path, Path]:
    """A sweep whose simulated trials kill their worker process now and then (spec, out)."""
    spec = simulate_spec(tmp_path / "crash.yaml", space={"A": list(range(20))},
                         simulate={"seed": 3, "crash_rate": 0.15, "trial_ms": 20},
                         run={"max_retries": 1, "finalists": 0})
    return spec, tmp_path / "run"


def check_one_line_per_death(done, out: Path, why: str) -> None:
    """Each death is one line of the sweep's own on stderr, `why` its reason (a regex);
    stdout holds the summary alone; the attempts and the crashed rows say the same."""
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("sweep sim: complete"), done.stdout
    # the summary (head, best, results, next), nothing else
    assert [line.split(":")[0].strip() for line in done.stdout.splitlines()[1:]] == \
        ["best", "results", "next"], done.stdout
    died = [line for line in done.stderr.splitlines() if " died running trial " in line]
    assert died, done.stderr
    assert all(re.fullmatch(r"worker w\d+ died running trial \d+ \(attempt \d(, alone)?\): "
                            + why, line) for line in died), died
    whys = [json.loads(line)["why"] for line in
            (out / "attempts.jsonl").read_text().splitlines()]
    assert len(whys) == len(died) and all(w.startswith("its process (pid ") for w in whys)
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    crashed = [r["error"] for r in rows if r["status"] == "crashed"]
    assert crashed and all(e.startswith("its worker died: its process (pid ") and
                           len(e) < 200 for e in crashed), crashed


def test_each_dead_worker_is_one_line_of_the_sweeps_own(tmp_path):
    spec, out = crashing_sweep(tmp_path)
    done = sweep_in("run", spec, "--out", out, *LOCAL)
    # simulate's crash is os._exit(17) in the worker process
    check_one_line_per_death(done, out, r"its process \(pid \d+\) ended \(exit code 17\)")


@pytest.mark.slow  # Ray's own reports; the line per death is checked on local above
def test_each_dead_worker_is_one_line_of_the_sweeps_own_and_rays_reports_stay_off_the_terminal(
        ray_address, tmp_path):
    # Ray prints a raylet paragraph of about a thousand characters on stdout for each
    # worker process that dies; the sweep says why in one line on stderr instead.
    spec, out = crashing_sweep(tmp_path)
    done = sweep_proc("run", spec, "--out", out, "--address", ray_address)
    check_one_line_per_death(done, out, r"its process \(pid \d+\) ended without a word \(.*\)")
    assert "raylet" not in done.stdout + done.stderr
    assert "Worker exit detail" in (out / "ray.log").read_text()  # kept, off the terminal
