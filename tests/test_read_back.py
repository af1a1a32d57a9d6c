"""Every file a run directory or the cache holds is input: a damaged, edited or special
one is refused in one line or read as absent, never trusted, never a hang or a traceback.

Special files are real ones (a FIFO from mkfifo, a link to /dev/zero), read by the CLI in a
process of its own with a timeout, so that a hang fails the test instead of pytest."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, simulate_spec, sweep_cli, sweep_in, sweep_proc, write_spec
from test_stop_resume import start, stderr_of, wait_until

from storage import cache
from storage.cache import CacheEntry, cache_dir, lookup
from storage.lock import RunDirLock
from storage.readback import ReadBackError, read_json, read_small
from sweep.search.warm_start import top_configs
from sweep.tuned import tuned_config

SPACE = {"A": list(range(8)), "B": list(range(5))}
PROBLEM = {"rows": 4, "cols": 64, "dtype": "float32"}


def softmax_spec(path: Path) -> Path:
    """Two configs on the interpreter: a real kernel, cached after one run."""
    return write_spec(path, name="tiny-softmax", kernel="softmax", problem=PROBLEM,
                      space={"BLOCK_N": [32, 64], "ROWS_PER_PROGRAM": [1]},
                      timing={"warmup_ms": 1, "rep_ms": 3, "screen": "off"},
                      run={"backend": "interpret", "workers": 1, "finalists": 0})


@pytest.fixture(scope="module")
def softmax_cache(tmp_path_factory) -> Path:
    """One complete softmax_spec run and the cache entry it wrote, in a cache of its own
    (the test's own cache is function-scoped), for each test to copy with cached_softmax."""
    tmp = tmp_path_factory.mktemp("softmax")
    done = sweep_in("run", softmax_spec(tmp / "s.yaml"), "--out", tmp / "a", "--runtime",
                    "local", env={"SWEEP_CACHE_DIR": str(tmp / "cache")})
    assert done.returncode == 0, done.stderr
    return tmp / "cache" / "best"


def cached_softmax(softmax_cache: Path) -> Path:
    """The test's cache as that run left it: its one entry, naming that run."""
    shutil.copytree(softmax_cache, cache_dir())
    return entry_file()


def entry_file() -> Path:
    (path,) = cache_dir().rglob("*.json")
    return path


def edit_json(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


# --- the readers themselves --------------------------------------------------------------

def test_a_fifo_or_a_device_is_refused_at_once_and_a_large_file_by_its_size(tmp_path):
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)  # no writer: a plain open would wait for one for ever
    with pytest.raises(ReadBackError, match="not a regular file but a FIFO"):
        read_json(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ReadBackError, match="a character device"):
        read_small(zero)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    with pytest.raises(ReadBackError, match="2,000 bytes"):
        read_small(big, limit=1000)
    nan = tmp_path / "nan.json"
    nan.write_text('{"latency_ms": NaN}')
    with pytest.raises(ReadBackError, match="not valid JSON"):
        read_json(nan)


# --- cache entries -----------------------------------------------------------------------

def stored_entry(**changes: object) -> Path:
    """A real entry, through cache.store, then edited on disk with its file name kept."""
    entry = CacheEntry(kernel="softmax", kernel_source="abc", problem=PROBLEM,
                       backend="interpret", device="cpu-interpreter",
                       config={"BLOCK_N": 32}, latency_ms=1.5, fingerprint="f" * 16,
                       run_dir="/nowhere", partial=False, written_at=1.7e9, runs=("f" * 16,))
    _, path = cache.store(entry)
    assert cache.read(path) is not None
    edit_json(path, **changes)
    return path


@pytest.mark.parametrize("changes", [
    {"latency_ms": float("nan")}, {"latency_ms": "fast"}, {"latency_ms": None},
    {"latency_ms": -1}, {"config": None}, {"config": "BLOCK_N=32"}, {"config": {}},
    {"config": {"BLOCK_N": [32]}}, {"written_at": 1e20}, {"partial": "no"},
    {"runs": "f" * 16}, {"versions": {"torch": 2}},
], ids=lambda c: "-".join(f"{k}={v!r}" for k, v in c.items()))
def test_a_cache_entry_with_a_field_of_the_wrong_type_or_range_is_a_miss(changes):
    path = stored_entry(**changes)
    assert cache.read(path) is None
    assert lookup("softmax", "abc", PROBLEM) == []


def test_a_special_file_in_the_cache_is_a_miss(tmp_path):
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    os.mkfifo(root / "a.json")
    (root / "b.json").symlink_to("/dev/zero")
    (root / "c.json").mkdir()
    assert cache.of_kernel("softmax") == []
    assert not cache.declared_somewhere("softmax", "x")


@pytest.mark.parametrize("config", [None, "BLOCK_N=32"])
def test_launch_code_gets_its_default_for_a_damaged_entry(softmax_cache, tmp_path, monkeypatch,
                                                          config):
    cached_softmax(softmax_cache)
    default = {"BLOCK_N": 16}
    found = tuned_config("softmax", PROBLEM, default=default, device="cpu-interpreter")
    assert found != default and found["BLOCK_N"] in (32, 64)
    # The same entry damaged, in a cache of its own: a cache's first answer is kept for
    # the life of the process, so this is the first lookup of that entry's file here.
    shutil.copytree(cache_dir(), tmp_path / "damaged" / "best")
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "damaged"))
    edit_json(entry_file(), config=config)
    assert tuned_config("softmax", PROBLEM, default=default, device="cpu-interpreter") == \
        default


def test_an_edited_entry_naming_another_parameter_is_not_the_answer_and_is_replaced(
        softmax_cache, tmp_path, capsys):
    spec = softmax_spec(tmp_path / "s.yaml")
    edit_json(cached_softmax(softmax_cache), config={"BLOCK_N": 9999, "EVIL": "x"},
              latency_ms=1e-9)
    capsys.readouterr()
    assert sweep_cli("run", spec, "--out", tmp_path / "b") == 0
    assert (tmp_path / "b" / "trials.parquet").exists()  # it ran
    assert "EVIL" not in capsys.readouterr().out
    # The run's best replaced the entry, however fast the edit claimed to be: the next
    # run is answered with it.
    (entry,) = cache.of_kernel("softmax")
    assert "EVIL" not in entry.config and entry.run_dir == str((tmp_path / "b").resolve())
    assert sweep_cli("run", spec, "--out", tmp_path / "c") == 0
    assert "cached" in capsys.readouterr().out and not (tmp_path / "c").exists()


def test_a_nan_latency_entry_is_replaced_by_the_next_complete_run(softmax_cache, tmp_path):
    spec = softmax_spec(tmp_path / "s.yaml")
    path = cached_softmax(softmax_cache)
    path.write_text(path.read_text().replace('"latency_ms": ', '"latency_ms": NaN, "x": '))
    assert sweep_cli("run", spec, "--out", tmp_path / "b") == 0
    assert (tmp_path / "b" / "trials.parquet").exists()
    (entry,) = cache.of_kernel("softmax")
    assert math.isfinite(entry.latency_ms) and entry.run_dir == str((tmp_path / "b").resolve())


def test_a_cached_best_outside_the_sweeps_values_is_said_to_lie_outside(softmax_cache,
                                                                        tmp_path, capsys):
    spec = softmax_spec(tmp_path / "s.yaml")
    edit_json(cached_softmax(softmax_cache), config={"BLOCK_N": 128, "ROWS_PER_PROGRAM": 1})
    capsys.readouterr()
    assert sweep_cli("run", spec, "--out", tmp_path / "b") == 0
    out = capsys.readouterr().out
    assert '"BLOCK_N": 128' in out and "(outside this sweep's space)" in out, out


def test_warm_start_reads_a_foreign_table_in_the_cached_run_as_no_table(tmp_path):
    entry = CacheEntry(kernel="softmax", kernel_source="abc", problem=PROBLEM,
                       backend="interpret", device="d", config={"BLOCK_N": 32},
                       latency_ms=1.0, fingerprint="f", run_dir=str(tmp_path),
                       partial=False, written_at=1.7e9)
    table = tmp_path / "trials.parquet"
    for columns in ({"config": ["{not json", "[1]"], "status": ["ok", "ok"],
                     "latency_ms": [1.0, 2.0], "device": ["d", "d"]},
                    {"config": ['{"BLOCK_N": 64}'], "status": [1], "latency_ms": [1.0],
                     "device": ["d"]}):
        pq.write_table(pa.table(columns), table)
        assert top_configs(entry, 5) == [{"BLOCK_N": 32}]
    table.unlink()
    os.mkfifo(table)
    assert top_configs(entry, 5) == [{"BLOCK_N": 32}]


# --- run directories ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One complete simulate run (and its cache entry, in a cache of its own), which each
    test copies and damages."""
    tmp = tmp_path_factory.mktemp("finished")
    spec = simulate_spec(tmp / "spec.yaml", space=SPACE, run={"finalists": 2})
    done = sweep_in("run", spec, "--out", tmp / "run", "--runtime", "local",
                      env={"SWEEP_CACHE_DIR": str(tmp / "cache")})
    assert done.returncode == 0, done.stderr
    return tmp / "run"


def sim_run(tmp_path: Path, finished: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def test_an_edited_search_plan_in_run_json_is_refused_not_followed(tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE,
                         search={"strategy": "guided", "budget": 0.9, "batch": 8})
    out = tmp_path / "run"
    assert sweep_in("run", spec, "--out", out, "--runtime", "local",
                      "--max-trials", "10").returncode == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["search"]["batch"] == 8
    edit_json(out / "run.json", search={**meta["search"], "batch": 3})
    before = (out / "journal.jsonl").read_bytes()
    done = sweep_in("resume", out, "--runtime", "local")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {out / 'run.json'}: changed since the run wrote "
                                   "it (its checksum does not match); restore it, or start "
                                   "a new run with sweep run")
    assert (out / "journal.jsonl").read_bytes() == before
    # A run.json from before the checksum is read as it stands.
    (out / "run.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "sha256"}))
    assert sweep_in("resume", out, "--runtime", "local").returncode == 0


@pytest.mark.parametrize("changes, said", [
    ({"total": True}, "a value of the wrong type"),
    ({"name": "x\x1b[31m\nforged line"}, "is no run's name"),
])
def test_a_damaged_run_json_is_one_line_without_the_damage(finished, tmp_path, changes,
                                                           said):
    out = sim_run(tmp_path, finished)
    meta = json.loads((out / "run.json").read_text())
    del meta["sha256"]  # as an older run.json, whose values alone are checked
    (out / "run.json").write_text(json.dumps({**meta, **changes}))
    done = sweep_in("resume", out, "--runtime", "local")
    assert done.returncode == 2 and said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "\x1b" not in done.stderr


@pytest.mark.parametrize("changes", [
    {"config": None}, {"by_device": {"simulated": 5}}, {"latency_ms": "1"},
    {"device": "x\x1b[2J"},
])
def test_sweep_best_refuses_a_damaged_best_json_in_one_line(finished, tmp_path,
                                                            changes):
    out = sim_run(tmp_path, finished)
    edit_json(out / "best.json", **changes)
    done = sweep_in("best", out)
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip() == (f"error: {out / 'best.json'}: missing or damaged; "
                                   f"`sweep resume {out}` rebuilds it")
    # ...which it does.
    assert sweep_in("resume", out, "--runtime", "local").returncode == 0
    assert sweep_in("best", out).returncode == 0


def test_sweep_best_of_a_run_in_use_says_so_instead_of_advising_resume(finished,
                                                                       tmp_path):
    out = sim_run(tmp_path, finished)
    (out / "best.json").unlink()
    lock = RunDirLock.acquire(out, "sweep resume (a test holding it)")
    try:
        done = sweep_in("best", out)
    finally:
        lock.release()
    assert done.returncode == 2
    assert "in use by a sweep (pid" in done.stderr and "sweep resume" not in \
        done.stderr.replace("sweep resume (a test holding it)", "")


@pytest.mark.parametrize("name, kind", [
    ("run.json", "fifo"), ("run.json", "dev-zero"), ("snapshot.json", "dev-zero"),
    ("snapshot.json", "fifo"), ("journal.jsonl", "fifo"), ("trials.parquet", "fifo"),
    ("spec.yaml", "fifo")])
def test_a_special_file_in_a_run_directory_never_hangs_a_resume(finished,
                                                                tmp_path, name, kind):
    out = sim_run(tmp_path, finished)
    (out / name).unlink()
    if kind == "fifo":
        os.mkfifo(out / name)
    else:
        (out / name).symlink_to("/dev/zero")
    done = sweep_proc("resume", out, "--runtime", "local", timeout=60)
    if name in ("snapshot.json", "trials.parquet"):  # rebuilt from the journal
        assert done.returncode == 0, done.stderr
        assert (out / name).is_file() and not (out / name).is_symlink()
    else:
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert f"{out / name}: not a regular file" in line


@pytest.mark.slow  # an interpreter sweep as a process; the readers are checked in-process above
def test_a_special_file_in_the_cache_never_hangs_a_sweep(tmp_path):
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    os.mkfifo(root / "0123.json")
    (root / "4567.json").symlink_to("/dev/zero")
    spec = softmax_spec(tmp_path / "s.yaml")
    done = sweep_proc("run", spec, "--out", tmp_path / "a", "--runtime", "local",
                      timeout=120)
    assert done.returncode == 0, done.stderr
    assert sweep_proc("best", spec, timeout=60).returncode == 0


def test_a_trials_jsonl_fifo_without_a_reader_is_refused_at_once(tmp_path):
    fifo = tmp_path / "trials.fifo"
    os.mkfifo(fifo)
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    done = sweep_proc("run", spec, "--out", tmp_path / "run", "--runtime", "local",
                      "--trials-jsonl", fifo, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: --trials-jsonl: cannot write {fifo} (a FIFO no "
                                   "process reads; start its reader first)")
    assert not (tmp_path / "run").exists()


def test_a_trials_jsonl_fifo_with_a_reader_gets_every_trial(tmp_path):
    from sweep.observers import TrialsJsonl

    fifo = tmp_path / "trials.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        # The check holds the FIFO open as it found it: a reader such as cat ends at the
        # EOF that closing the last writer gives.
        jsonl = TrialsJsonl(fifo)
        with pytest.raises(BlockingIOError):  # a writer there, nothing written yet
            os.read(reader, 1)
        jsonl.close()
        assert os.read(reader, 1) == b""  # EOF: no writer left
        spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE, run={"finalists": 0})
        done = sweep_proc("run", spec, "--out", tmp_path / "run", "--runtime", "local",
                          "--trials-jsonl", fifo, timeout=60)
        assert done.returncode == 0, done.stderr
        data = b""
        while chunk := os.read(reader, 1 << 16):  # 40 lines: within the pipe's buffer
            data += chunk
    finally:
        os.close(reader)
    lines = data.decode().splitlines()
    assert sorted(json.loads(line)["index"] for line in lines) == list(range(40))


# Reads the FIFO's first line (open read-write: it never sees an EOF, and is a reader
# before the sweep opens it), says so, then reads nothing more while it lives.
STALLED_READER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
print("ready", flush=True)
data = b""
while b"\\n" not in data:
    data += os.read(fd, 1)
print("stalled", flush=True)
sys.stdin.read()
"""


def test_a_trials_jsonl_reader_that_stops_reading_is_let_go_and_sigint_still_ends_the_run(
        tmp_path):
    fifo = tmp_path / "trials.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c", STALLED_READER, fifo],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out = tmp_path / "sweep" / "run"
    try:
        assert reader.stdout.readline() == "ready\n"
        spec = simulate_spec(tmp_path / "spec.yaml",
                             space={"A": list(range(100)), "B": list(range(100))},
                             simulate={"trial_ms": 2}, run={"finalists": 0})
        proc = start(["run", spec, "--out", out, "--runtime", "local", "--trials-jsonl", fifo],
                     out, [])
        assert reader.stdout.readline() == "stalled\n"
        # a full pipe no longer holds the sweep: its trials go on, and it says so once
        wait_until(lambda: "its reader has stopped reading" in stderr_of(out), proc, 120)
        os.killpg(proc.pid, signal.SIGINT)  # no write to wait in: it stops as ever
        proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr_of(out)
    finally:
        reader.kill()
        reader.communicate()
    said = [line for line in stderr_of(out).splitlines() if "trials JSONL" in line]
    assert said == [f"warning: trials JSONL {fifo}: its reader has stopped reading; no more "
                    "trials are written there (the run goes on)"], stderr_of(out)
    again = sweep_in("resume", out)
    assert again.returncode == 0, again.stderr
    assert pq.read_table(out / "trials.parquet", columns=["index"]).num_rows == 10_000


def test_a_spec_from_a_pipe_is_read_once(tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE, run={"finalists": 0})
    out = tmp_path / "run"
    done = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m sweep run <(cat "{spec}") --out "{out}" '
                       "--runtime local"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out / "trials.parquet").num_rows == 40
    assert (out / "spec.yaml").read_text() == spec.read_text()


@pytest.mark.parametrize("strategy", ["guided", "halving"])
def test_a_negative_search_seed_is_refused_before_anything_is_written(tmp_path, strategy):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE,
                         search={"strategy": strategy, "seed": -1})
    done = sweep_in("run", spec, "--out", tmp_path / "run")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {spec}: search.seed: expected an integer >= 0, "
                                   "got -1")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a real SIGINT after seconds of trials (test_stop_resume's stay default)
def test_sigint_during_halvings_rungs_stops_the_run_with_130(tmp_path):
    # 8 screened configs of 1 s on 2 workers (too few to sample: every one; see
    # test_small_space.py), then a rung of 4 that takes a trial's time.
    spec = simulate_spec(tmp_path / "spec.yaml", space={"A": list(range(8))},
                         search={"strategy": "halving", "sample": 0.5, "eta": 2, "seed": 1},
                         simulate={"workers": 2, "trial_ms": 1000}, run={"finalists": 2})
    out = tmp_path / "run"
    proc = start(["run", spec, "--out", out], out, ["--runtime", "local"])
    wait_until(lambda: "rung 1:" in stderr_of(out), proc)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr_of(out)
    assert "stopped before the fastest configs were re-timed side by side" in stderr_of(out)
    best = json.loads((out / "best.json").read_text())
    assert best["finalists"] == []  # the one pass's order stands


def test_the_checks_read_what_this_tool_writes(finished, tmp_path):
    """Every file of a real run passes its reader's checks (a check too strict would turn
    a good run into a refusal)."""
    out = sim_run(tmp_path, finished)
    from storage.best_file import read_best
    from storage.snapshot import read_snapshot
    from sweep.run.rundir import RunDir, read_meta

    meta = read_meta(RunDir(out))
    assert read_best(out / "best.json", meta["fingerprint"]) is not None
    assert read_snapshot(out / "snapshot.json").state == "complete"
    (entry,) = cache.of_kernel("matmul", finished.parent / "cache" / "best")
    assert asdict(entry)["config"] == json.loads((out / "best.json").read_text())["config"]


def test_a_run_name_a_spec_accepts_is_read_back_from_run_json(finished,
                                                               tmp_path):
    out = sim_run(tmp_path, finished)
    meta = json.loads((out / "run.json").read_text())
    del meta["sha256"]
    (out / "run.json").write_text(json.dumps({**meta, "name": "run\u00a0one"}))
    done = sweep_in("resume", out, "--runtime", "local")
    assert done.returncode == 0, done.stderr


def test_an_entry_that_cannot_answer_is_dropped_with_the_sweeps_it_answered():
    wide = CacheEntry(kernel="k", kernel_source="s", problem={}, backend="interpret",
                      device="d", config={"A": 1, "B": 2, "C": 3}, latency_ms=1.0,
                      fingerprint="WIDE", run_dir="/w", partial=False, written_at=1.7e9,
                      runs=("WIDE",))
    cache.store(wide)
    narrow = CacheEntry(**{**asdict(wide), "config": {"A": 1, "B": 2}, "latency_ms": 2.0,
                           "fingerprint": "NARROW", "runs": ("NARROW",)})
    kept, _ = cache.store(narrow, unfit=lambda held: not set(held.config) <= {"A", "B"})
    # The wide sweep is no longer answered with the narrow one's slower best.
    assert (dict(kept.config), kept.runs) == ({"A": 1, "B": 2}, ("NARROW",))


def test_a_lock_file_naming_no_live_holder_here_accuses_no_one(tmp_path):
    import socket

    from storage.lock import LOCK_NAME, holder

    lock = tmp_path / LOCK_NAME
    for doc in ({"pid": os.getpid(), "host": socket.gethostname()},  # fields missing
                {"pid": os.getpid(), "host": "another-host", "since": "x", "command": "y"},
                [1, 2], "text"):
        lock.write_text(json.dumps(doc))
        assert holder(tmp_path) == (
            f"pid {os.getpid()} on {socket.gethostname()} since None: None"
            if doc == {"pid": os.getpid(), "host": socket.gethostname()} else None)


@pytest.mark.parametrize("changes", [{"counts": [1]}, {"timeline": {"x": "y"}},
                                     {"sessions": [[1]]}, {"finalists": {"a": 1}}])
def test_a_snapshot_of_the_wrong_shape_is_unreadable_not_a_traceback(tmp_path, changes):
    from storage.snapshot import Snapshot, SnapshotError, read_snapshot, write_snapshot

    path = tmp_path / "snapshot.json"
    write_snapshot(path, Snapshot("complete", "f", 1, 1, {"ok": 1}, None))
    doc = json.loads(path.read_text())
    body = {**doc["snapshot"], **changes}
    from storage.snapshot import checksum  # the checksum proves a file whole, no more
    path.write_text(json.dumps({"snapshot": body, "sha256": checksum(body)}))
    with pytest.raises(SnapshotError, match="unreadable"):
        read_snapshot(path)


def test_sweep_report_of_a_foreign_table_is_one_line(finished, tmp_path):
    out = sim_run(tmp_path, finished)
    pq.write_table(pa.table({"index": [0], "config": ["{}"]}), out / "trials.parquet")
    done = sweep_in("report", out)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "not a trial table: no column status" in line, line
