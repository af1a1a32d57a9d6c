"""Compile-aware scheduling, measured through the replay backend: a recorded table played
back on simulated GPUs and compile slots, through the real driver, Ray actors and workers.
What a GPU run does with a slow compile is decided here on the CPU."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, sweep_cli, write_spec

from actors.compile_limit import Stopped, heavier
from actors.protocol import CompileLimit
from actors.replay import Recorded, ReplayCompiler
from storage.records import TrialOutcome, TrialRecord, Where, canonical_json
from sweep.search.scheduling import (
    FACTOR,
    FLOOR_S,
    HEAVY_SHARE,
    MIN_COMPILES,
    AdaptiveLimit,
    compile_order,
)
from sweep.spec.space import expand

T0 = datetime(2026, 11, 30, tzinfo=timezone.utc)
# Where the runtime is not what a test checks, it runs on the local one, in this process.
LOCAL = ("--runtime", "local")


def recorded_table(path: Path, rows: list[dict]) -> Path:
    """A trial table as a GPU run writes it, with only the columns replay reads.
    rows: config, compile_ms, gpu_ms, status (default ok), latency_ms, error."""
    cols: dict[str, list] = {k: [] for k in (
        "config", "status", "validation", "latency_ms", "latency_p20_ms", "latency_p80_ms",
        "error", "compile_ms", "started_at", "finished_at")}
    for r in rows:
        status = r.get("status", "ok")
        latency = r.get("latency_ms", 1.0) if status == "ok" else None
        cols["config"].append(canonical_json(r["config"]))
        cols["status"].append(status)
        cols["validation"].append("passed" if status == "ok" else "skipped")
        for k in ("latency_ms", "latency_p20_ms", "latency_p80_ms"):
            cols[k].append(latency)
        cols["error"].append(r.get("error"))
        cols["compile_ms"].append(r["compile_ms"])
        cols["started_at"].append(T0)
        cols["finished_at"].append(T0 + timedelta(milliseconds=r.get("gpu_ms", 10)))
    pq.write_table(pa.table(cols), path)
    return path


def replay_spec(tmp_path: Path, space: dict, rows: list[dict], **run) -> Path:
    recorded_table(tmp_path / "recorded.parquet", rows)
    return write_spec(tmp_path / "replay.yaml", name="replay", kernel="matmul", space=space,
                      run={"backend": "replay", "finalists": 0, **run},
                      replay={"table": "recorded.parquet", "workers": 1, "compile_slots": 2})


def table_rows(out: Path) -> list[dict]:
    return pq.read_table(out / "trials.parquet").to_pylist()


def test_a_compiled_config_runs_while_a_slow_one_still_compiles(runtime_args, tmp_path):
    # BLOCK 8 is the largest tile, so it is handed out and starts compiling first; it takes
    # 1.5 s while the other seven compile in 0.05 s each on the second slot. A worker that
    # ran configs in the order sent would idle its GPU 1.5 s behind it.
    space = {"BLOCK": [1, 2, 3, 4, 5, 6, 7, 8]}
    rows = [{"config": {"BLOCK": b}, "compile_ms": 1500 if b == 8 else 50,
             "latency_ms": float(b)} for b in space["BLOCK"]]
    spec = replay_spec(tmp_path, space, rows)
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *runtime_args) == 0
    got = sorted(table_rows(tmp_path / "run"), key=lambda r: r["started_at"])
    order = [json.loads(r["config"])["BLOCK"] for r in got]
    assert order[-1] == 8, order
    assert [r["index"] for r in table_rows(tmp_path / "run")] == list(range(8))
    slow = got[-1]
    assert slow["compile_ms"] == pytest.approx(1500, abs=200)
    # The other seven ran before the slow compile ended, back to back.
    assert all(r["finished_at"] <= slow["started_at"] for r in got[:-1])


def test_a_compile_past_the_fixed_limit_is_recorded_timeout_and_the_sweep_goes_on(
        runtime_args, tmp_path):
    space = {"BLOCK": [1, 2, 3, 4]}
    rows = [{"config": {"BLOCK": b}, "compile_ms": 5000 if b == 4 else 20} for b in [1, 2, 3, 4]]
    spec = replay_spec(tmp_path, space, rows, compile_timeout_s=0.5)
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *runtime_args) == 0
    got = {json.loads(r["config"])["BLOCK"]: r for r in table_rows(tmp_path / "run")}
    assert got[4]["status"] == "timeout", got[4]
    assert "run.compile_timeout_s" in got[4]["error"]
    assert got[4]["compile_ms"] == pytest.approx(500, abs=150)
    assert {got[b]["status"] for b in (1, 2, 3)} == {"ok"}


def test_the_replay_compiler_stops_a_compile_at_the_runs_adaptive_limit():
    never = Recorded("timeout", "skipped", None, None, None, "compile took longer than 60 s",
                     float("inf"), 0.0)
    quick = Recorded("ok", "passed", 1.0, 1.0, 1.0, None, 0.01, 0.0)
    pool = ReplayCompiler({canonical_json({"c": "never"}): never,
                           canonical_json({"c": "quick"}): quick}, 2, CompileLimit(60))
    pool.set_limit(CompileLimit(0.2, median_s=0.02, fixed_s=60.0))
    pool.submit(0, {"c": "never"})
    pool.submit(1, {"c": "quick"})
    got: dict[int, object] = {}
    while len(got) < 2:
        taken = pool.take([0, 1])
        if taken is None:
            pool.wait(1.0)
        else:
            got[taken[0]] = taken[1]
    assert got[1].ok
    assert got[0].timed_out and not got[0].ok
    assert got[0].error == (
        "compile took longer than 0.2 s, 10x this run's median compile of 0.02 s "
        "(run.compile_timeout_s: auto); sweep resume DIR --retry timeout gives it the full "
        "60 s"), got[0].error
    assert got[0].compile_ms == pytest.approx(200, abs=100)


def test_the_adaptive_limit_follows_the_runs_own_median_within_floor_and_ceiling():
    limit = AdaptiveLimit(60.0, adaptive=True)
    limit.observe_compiles([300.0] * (MIN_COMPILES - 1))
    assert limit.current == CompileLimit(60.0)  # too few compiles yet
    limit.observe_compiles([300.0])
    assert limit.current == CompileLimit(FLOOR_S, 0.3, 60.0)  # 10 x 0.3 s is under the floor
    limit.observe_compiles([3000.0] * 300)  # the median is now 3 s
    assert limit.current == CompileLimit(FACTOR * 3.0, 3.0, 60.0)
    limit.observe_compiles([20_000.0] * 1000)  # 10 x 20 s is past the fixed limit
    assert limit.current == CompileLimit(60.0)
    # A heavy tenth (as Liger's RMSNorm had) does not lift the limit: the median rules.
    tail = AdaptiveLimit(60.0, adaptive=True)
    tail.observe_compiles([200.0] * 85 + [30_000.0] * 15)
    assert tail.current == CompileLimit(FLOOR_S, 0.2, 60.0)
    fixed = AdaptiveLimit(60.0, adaptive=False, seen=[("ok", 1000.0)] * 100)
    assert fixed.current == CompileLimit(60.0)
    # Cache hits (a few ms) and compiles stopped by a limit are not samples.
    resumed = AdaptiveLimit(60.0, adaptive=True, seen=[("ok", 5.0)] * 100 + [
        ("timeout", 60_000.0)] * 100 + [("compile_error", 2000.0)] * (MIN_COMPILES - 1))
    assert resumed.current == CompileLimit(60.0)
    resumed.observe([TrialRecord.from_outcome(
        0, {}, TrialOutcome("ok", "passed", latency_ms=1.0, compile_ms=2000.0),
        where=Where("d", "n", "w"), attempt=1, started_at=0.0, finished_at=1.0)])
    assert resumed.current == CompileLimit(FACTOR * 2.0, 2.0, 60.0)


def test_the_heavy_tail_climbs_from_below_with_the_light_configs_between():
    space = expand({"BLOCK_M": [16, 64], "BLOCK_N": [32, 128], "num_stages": [2, 4],
                    "num_warps": [1, 8]}, [])
    order = compile_order(space, range(len(space)))
    configs = [space.config(i) for i in order]
    weights = [c["BLOCK_M"] * c["BLOCK_N"] * c["num_stages"] / c["num_warps"]
               for c in configs]
    heavy = sorted(weights)[-math.ceil(len(weights) * HEAVY_SHARE):]
    # the heavy lane first, lightest of its configs first, the light lane's between
    assert weights[0] == heavy[0] and weights[1] == min(weights)
    assert weights[0:2 * len(heavy):2] == heavy
    assert weights[1::2] == sorted(weights[1::2])
    assert sorted(weights[2 * len(heavy):]) == weights[2 * len(heavy):]
    assert max(weights[1::2]) <= heavy[0]
    assert sorted(order) == list(range(len(space)))


def test_replaying_the_checked_in_gpu_table_gives_back_its_outcomes_row_by_row(tmp_path):
    spec = ROOT / "configs" / "replay-600.yaml"
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, *LOCAL) == 0
    got = pq.read_table(out / "trials.parquet").to_pylist()
    recorded = {r["config"]: r for r in pq.read_table(
        ROOT / "benchmarks" / "tables" / "matmul600-h200.parquet").to_pylist()}
    assert len(got) == len(recorded) == 600
    for row in got:
        was = recorded[row["config"]]
        assert (row["status"], row["latency_ms"], row["error"]) == \
            (was["status"], was["latency_ms"], was["error"]), row["index"]
    best = json.loads((out / "best.json").read_text())
    ok = [r for r in got if r["status"] == "ok"]
    assert best["latency_ms"] == min(r["latency_ms"] for r in ok)


def test_resume_retry_timeout_runs_configs_a_compile_limit_stopped_under_the_trial_timeout(
        tmp_path):
    space = {"BLOCK": [1, 2, 3, 4]}
    rows = [{"config": {"BLOCK": b}, "compile_ms": 1500 if b == 4 else 20,
             "latency_ms": 5.0 - b} for b in [1, 2, 3, 4]]
    spec = replay_spec(tmp_path, space, rows, compile_timeout_s=0.5, trial_timeout_s=20)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, *LOCAL) == 0
    first = {json.loads(r["config"])["BLOCK"]: r for r in table_rows(out)}
    assert first[4]["status"] == "timeout"
    journal_before_retry = (out / "journal.jsonl").read_bytes()
    assert json.loads((out / "best.json").read_text())["config"] == {"BLOCK": 3}

    assert sweep_cli("resume", out, "--retry", "timeout", *LOCAL) == 0
    got = table_rows(out)
    assert [r["index"] for r in got] == [0, 1, 2, 3]  # each index once, in order
    again = {json.loads(r["config"])["BLOCK"]: r for r in got}
    assert (again[4]["status"], again[4]["attempt"]) == ("ok", 2), again[4]
    assert again[4]["compile_ms"] == pytest.approx(1500, abs=300)
    assert all(again[b] == first[b] for b in (1, 2, 3))  # the others untouched
    assert json.loads((out / "best.json").read_text())["config"] == {"BLOCK": 4}
    journal = (out / "journal.jsonl").read_text().splitlines()
    assert len(journal) == 5  # the timeout record stays; the retry's supersedes it

    # Nothing left to retry: a complete run stays as it is.
    assert sweep_cli("resume", out, "--retry", "timeout", *LOCAL) == 0
    assert table_rows(out) == got

    # The directory restored with the journal from before the retry: the table's newer
    # attempt wins over the journal's older one, and goes back into the journal.
    (out / "journal.jsonl").write_bytes(journal_before_retry)
    assert sweep_cli("resume", out, *LOCAL) == 0
    assert table_rows(out) == got
    assert len((out / "journal.jsonl").read_text().splitlines()) == 5


def test_retry_names_only_statuses_a_run_records(tmp_path, capsys):
    assert sweep_cli("resume", tmp_path, "--retry", "slow") == 2
    assert "--retry: expected statuses from compile_error" in capsys.readouterr().err


def test_a_fifo_put_in_place_of_the_recorded_table_is_one_line_not_a_hang(tmp_path):
    """The spec's check of the table passed; a FIFO put there before a worker loads it is
    refused by name (pyarrow's open by path called it missing, in a traceback). In a
    process of its own, bounded: a load that blocks on the FIFO is a test that fails, not
    one that hangs."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "recorded.parquet"
    os.mkfifo(fifo)
    load = ("import sys\nfrom actors.replay import ReplayBackend, ReplayTableError\n"
            "try:\n    ReplayBackend.load({'table': sys.argv[1]})\n"
            "except ReplayTableError as e:\n    print(e)\n")
    try:
        done = subprocess.run([sys.executable, "-c", load, str(fifo)], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail("the replay backend blocked in open() on the FIFO")
    assert done.stdout == f"cannot read {fifo} as Parquet (not a regular file but a FIFO)\n"
    assert done.returncode == 0, done.stderr


def test_a_damaged_or_foreign_recorded_table_is_one_line_naming_it(tmp_path):
    from actors.replay import ReplayBackend, ReplayTableError

    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(b"PAR1 not a table")
    with pytest.raises(ReplayTableError, match=f"^cannot read {damaged} as Parquet \\(.+\\)$"):
        ReplayBackend.load({"table": str(damaged)})
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"config": ["{}"], "status": ["ok"]}), foreign)
    with pytest.raises(ReplayTableError, match=f"^{foreign} lacks the column\\(s\\) "
                                               "validation, .* of a trial table$"):
        ReplayBackend.load({"table": str(foreign)})
    gone = tmp_path / "gone.parquet"
    with pytest.raises(ReplayTableError, match=f"^cannot read {gone} as Parquet "
                                               "\\(No such file or directory\\)$"):
        ReplayBackend.load({"table": str(gone)})


def test_a_config_at_least_as_heavy_in_every_parameter_is_heavier():
    stopped = {"BLOCK": 64, "STAGES": 3, "num_warps": 4, "dtype": "float16", "EVEN": True}
    assert heavier(stopped, stopped)
    assert heavier({**stopped, "BLOCK": 128, "num_warps": 2}, stopped)
    assert not heavier({**stopped, "BLOCK": 128, "num_warps": 8}, stopped)
    assert not heavier({**stopped, "STAGES": 2}, stopped)
    assert not heavier({**stopped, "dtype": "float32"}, stopped)
    assert not heavier({**stopped, "EVEN": False}, stopped)
    assert not heavier({k: v for k, v in stopped.items() if k != "EVEN"}, stopped)
    # a problem's size is the problem's, not a parameter to be heavier in
    sized = {**stopped, "M": 4096}
    assert heavier({**sized, "BLOCK": 128}, sized, problem_keys=("M", "dtype"))
    assert not heavier({**sized, "M": 8192}, sized, problem_keys=("M", "dtype"))
    assert heavier({**sized, "M": 8192}, sized)  # a parameter M


def test_only_a_learnt_limit_rules_heavier_configs_out():
    stopped = Stopped()
    assert not stopped.add(3, {"BLOCK": 64}, CompileLimit(30.0))  # the user's own limit
    assert stopped.why({"BLOCK": 128}) is None
    learnt = CompileLimit(5.0, median_s=0.3, fixed_s=60.0)
    assert stopped.add(7, {"BLOCK": 64}, learnt)
    assert stopped.why({"BLOCK": 32}) is None
    assert stopped.why({"BLOCK": 128}) == (
        "not compiled: at least as heavy in every parameter as trial 7, whose compile took "
        "longer than 5 s, 17x this run's median compile of 0.3 s (run.compile_timeout_s: "
        "auto); sweep resume DIR --retry timeout gives this config the full 60 s")


def test_the_replay_compiler_rules_out_what_is_heavier_than_a_config_its_limit_stopped():
    never = Recorded("timeout", "skipped", None, None, None, "compile took longer than 60 s",
                     float("inf"), 0.0)
    quick = Recorded("ok", "passed", 1.0, 1.0, 1.0, None, 0.01, 0.0)
    table = {canonical_json({"B": b, "c": "x"}): never if b >= 4 else quick
             for b in (1, 4, 8, 16)}
    pool = ReplayCompiler(table, 1, CompileLimit(60))
    pool.set_limit(CompileLimit(0.2, median_s=0.02, fixed_s=60.0))
    pool.submit(0, {"B": 4, "c": "x"})  # one slot: the others queue behind it
    pool.submit(1, {"B": 8, "c": "x"})
    pool.submit(2, {"B": 1, "c": "x"})
    pool.hint(3, {"B": 16, "c": "x"})
    got: dict[int, object] = {}
    while len(got) < 3:
        taken = pool.take([0, 1, 2])
        if taken is None:
            pool.wait(1.0)
        else:
            got[taken[0]] = taken[1]
    assert got[0].timed_out and got[0].compile_ms == pytest.approx(200, abs=100)
    assert got[1].timed_out and not got[1].ok and got[1].compile_ms is None
    assert got[1].error.startswith("not compiled: at least as heavy in every parameter as "
                                   "trial 0, whose compile took longer than 0.2 s"), got[1]
    assert got[2].ok
    # the hint was dropped, uncompiled; submitted, it is ruled out at once
    assert not pool._hints
    pool.submit(3, {"B": 16, "c": "x"})
    ruled = pool.take([3])
    assert ruled is not None and ruled[1].compile_ms is None and ruled[1].timed_out


def test_a_recorded_row_the_rule_left_uncompiled_replays_as_a_compile_that_never_ends(
        tmp_path):
    space = {"BLOCK": [1, 2, 3, 4]}
    rows = [{"config": {"BLOCK": b}, "compile_ms": 20} for b in (1, 2, 3)] + [
        {"config": {"BLOCK": 4}, "compile_ms": None, "status": "timeout",
         "error": "not compiled: at least as heavy in every parameter as trial 2, whose "
                  "compile took longer than 5 s"}]
    spec = replay_spec(tmp_path, space, rows, compile_timeout_s=0.5, trial_timeout_s=20)
    assert sweep_cli("run", spec, "--out", tmp_path / "run", *LOCAL) == 0
    got = {json.loads(r["config"])["BLOCK"]: r for r in table_rows(tmp_path / "run")}
    assert got[4]["status"] == "timeout", got[4]
    assert got[4]["error"] == "compile took longer than 0.5 s (run.compile_timeout_s)"
    assert {got[b]["status"] for b in (1, 2, 3)} == {"ok"}


def test_a_hint_stopped_by_the_limit_rules_nothing_out_for_its_own_worker():
    # a hint is another worker's config, which its own pool compiles under its own limit
    never = Recorded("timeout", "skipped", None, None, None, "compile took longer than 60 s",
                     float("inf"), 0.0)
    table = {canonical_json({"B": b}): never for b in (4, 8)}
    pool = ReplayCompiler(table, 1, CompileLimit(60))
    pool.set_limit(CompileLimit(0.2, median_s=0.02, fixed_s=60.0))
    pool.hint(0, {"B": 4})
    while not pool._done:
        pool.wait(1.0)
        pool.take([])
    pool.submit(1, {"B": 8})
    got = None
    while got is None:
        got = pool.take([1])
        pool.wait(1.0)
    assert got[1].timed_out and got[1].error.startswith("compile took longer than 0.2 s")
