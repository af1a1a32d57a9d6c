"""The run directory against hostile conditions, through the real CLI: a second process,
a full disk, a journal that lies or was replaced, a read-only directory, a resumed
complete run, a tampered spec.yaml."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    ROOT,
    read_only_view,
    simulate_spec,
    sweep_cli,
    sweep_proc,
    tmpfs,
    write_spec,
)

import storage.journal_file as journal_file
import storage.snapshot as snapshot_module
from storage.journal import read_journal
from sweep.run import rundir
from sweep.spec import load_spec

SPACE = {"A": list(range(10)), "B": list(range(6))}


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def rows_of(out: Path) -> list[dict]:
    return pq.read_table(out / "trials.parquet").to_pylist()


def assert_each_index_once(out: Path, total: int) -> None:
    assert [r["index"] for r in rows_of(out)] == list(range(total))


# --- one process at a time ---------------------------------------------------------------
def test_a_second_sweep_on_a_directory_in_use_is_refused_naming_the_first(tmp_path, capsys):
    first_spec = simulate_spec(tmp_path / "a.yaml", space={"A": list(range(12))},
                               simulate={"workers": 1, "trial_ms": 100}, run={"finalists": 0})
    other_spec = simulate_spec(tmp_path / "b.yaml", space={"B": list(range(7))})
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", first_spec, "--out", out, "--runtime",
         "local"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.stat().st_size):  # it holds the lock and runs
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    # Held (SIGSTOP) while the others try: it cannot finish and give the directory back
    # first, however slowly a busy machine runs them. Its lock stays held meanwhile.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        capsys.readouterr()
        for args in (["run", other_spec, "--out", out], ["resume", out]):
            assert sweep_cli(*args) == 2
            line = one_error_line(capsys.readouterr().err)
            assert f"{out}: in use by another sweep (pid {first.pid} on " in line
            assert f"sweep run {first_spec}" in line
    finally:
        os.kill(first.pid, signal.SIGCONT)
    first.communicate(timeout=120)
    assert first.returncode == 0
    assert (out / "spec.yaml").read_text() == first_spec.read_text()
    assert_each_index_once(out, 12)


def test_two_runs_started_together_into_one_directory_leave_one_consistent_run(tmp_path):
    specs = [simulate_spec(tmp_path / f"{n}.yaml", space={n: list(range(k))})
             for n, k in (("A", 30), ("B", 11))]
    out = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, "-m", "sweep", "run", spec, "--out", out,
                               "--runtime", "local"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for spec in specs]
    codes = [p.wait(timeout=120) for p in procs]
    assert sorted(codes) == [0, 2], [p.stderr.read() for p in procs]  # type: ignore[union-attr]
    winner = specs[codes.index(0)]
    assert (out / "spec.yaml").read_text() == winner.read_text()
    assert json.loads((out / "run.json").read_text())["fingerprint"] == \
        load_spec(winner).fingerprint
    assert_each_index_once(out, len(load_spec(winner).expand()))


# --- a full disk -------------------------------------------------------------------------
def assert_full_disk_line(line: str, out: Path) -> None:
    assert line.startswith(f"error: {out}: "), line
    assert "space left on device" in line.lower(), line
    assert line.endswith(f"while writing the run directory; every trial acknowledged is in "
                         f"its journal. Make room, then: sweep resume {out}"), line


def test_a_full_disk_ends_the_run_with_one_line_and_resume_completes_once_space_is_back(
        tmp_path, monkeypatch, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE,
                         simulate={"workers": 2, "trial_ms": 5})
    out = tmp_path / "run"
    appends = {"n": 0}
    real_write = os.write

    # The run's journal fills the disk at its second append: the first holds at most the
    # trials handed out before any came back (two batches a worker), however a busy
    # machine groups them.
    def write(fd: int, data: bytes) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(out / "journal.jsonl"):
            appends["n"] += 1
            if appends["n"] >= 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    capsys.readouterr()
    # Only the write is given back afterwards (monkeypatch.undo() would also give back the
    # private best-config cache, and the resume would write to the user's own).
    with monkeypatch.context() as full_disk:
        full_disk.setattr(journal_file.os, "write", write)
        assert sweep_cli("run", spec, "--out", out) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert_full_disk_line(err.strip().splitlines()[-1], out)
    raw = (out / "journal.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # nothing torn
    acknowledged = len(raw.splitlines())
    assert 0 < acknowledged < 60
    assert sweep_cli("resume", out) == 0
    assert_each_index_once(out, 60)


def test_a_run_on_a_disk_that_fills_up_stops_cleanly_and_resumes_when_space_is_back(
        tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", space={"A": list(range(400))},
                         simulate={"workers": 2, "trial_ms": 1}, run={"snapshot_every_s": 60})
    # 72 KiB free at first; with the filler gone, room for the whole run (about 180 KiB
    # of files, and the table's replacement written beside the old one).
    with tmpfs(tmp_path / "disk", "320k") as disk:
        (disk / "filler").write_bytes(b"x" * 248 * 1024)
        out = disk / "run"
        result = sweep_proc("run", spec, "--out", out, "--runtime", "local")
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert_full_disk_line(result.stderr.strip().splitlines()[-1], out)
        raw = (out / "journal.jsonl").read_bytes()
        assert raw.endswith(b"\n") and 0 < len(raw.splitlines()) < 400
        (disk / "filler").unlink()
        result = sweep_proc("resume", out, "--runtime", "local")
        assert result.returncode == 0, result.stderr
        assert_each_index_once(out, 400)


# --- the journal and the table -----------------------------------------------------------
LIES = {
    "index -1": lambda line: {**line, "index": -1},
    "index out of range": lambda line: {**line, "index": 60},
    "index as text": lambda line: {**line, "index": str(line["index"])},
    "no config": lambda line: {"index": line["index"], "status": "ok"},
    "empty": lambda line: {},
    "another run's": lambda line: {**line, "run": "fedcba9876543210"},
    "config of another index": lambda line: {**line, "config": '{"A":9,"B":5}'},
}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped after 10 trials, to copy."""
    tmp = tmp_path_factory.mktemp("stopped")
    spec = simulate_spec(tmp / "spec.yaml", space=SPACE)
    assert sweep_cli("run", spec, "--out", tmp / "run", "--max-trials", "10") == 0
    return tmp / "run"


@pytest.mark.parametrize("lie", LIES)
def test_resume_refuses_a_journal_line_that_lies_naming_it_and_touching_nothing(
        stopped_run, tmp_path, capsys, lie):
    out = tmp_path / "run"
    shutil.copytree(stopped_run, out)
    journal = out / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    forged = json.dumps(LIES[lie](json.loads(lines[0]))).encode() + b"\n"
    journal.write_bytes(b"".join(lines[:3]) + forged + b"".join(lines[3:]))
    before = files(out)
    capsys.readouterr()
    assert sweep_cli("resume", out) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {journal}: line 4: "), line
    assert files(out) == before


def test_a_journal_shorter_than_the_tables_offset_resumes_keeping_the_tables_trials(
        tmp_path, capsys):
    # A run directory restored from a backup: the table was written after the journal.
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, "--max-trials", "30") == 0
    journal = out / "journal.jsonl"
    in_table = {r["index"] for r in rows_of(out)}
    journal.write_bytes(b"".join(journal.read_bytes().splitlines(keepends=True)[:8]))
    capsys.readouterr()
    assert sweep_cli("resume", out) == 0
    assert "recovered 22 trials that only trials.parquet held" in capsys.readouterr().err
    rows = rows_of(out)
    assert [r["index"] for r in rows] == list(range(60))
    assert all(r["attempt"] == 1 for r in rows if r["index"] in in_table)  # not re-run
    check = rundir.record_check(load_spec(spec), load_spec(spec).expand())
    assert read_journal(journal, check)[0].num_rows == 60  # the journal holds them again


# --- a complete run resumed --------------------------------------------------------------
def test_resuming_a_complete_run_rewrites_nothing_and_rebuilds_only_what_is_missing(
        tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out) == 0
    before = files(out)
    best = json.loads(before["best.json"])
    assert len(best["finalists"]) == 5
    capsys.readouterr()
    assert sweep_cli("resume", out) == 0
    assert "already complete (60 trials); nothing to do" in capsys.readouterr().out
    assert files(out) == before
    (out / "best.json").unlink()
    (out / "trials.parquet").unlink()
    assert sweep_cli("resume", out) == 0
    assert "rebuilt trials.parquet and best.json" in capsys.readouterr().out
    assert json.loads((out / "best.json").read_text()) == best
    assert files(out)["snapshot.json"] == before["snapshot.json"]
    assert rows_of(out) == pq.read_table(pa.BufferReader(before["trials.parquet"])).to_pylist()


# --- what a run directory can make the CLI import ----------------------------------------
def test_resume_checks_an_edited_spec_before_importing_the_module_it_names(
        tmp_path, capsys, monkeypatch):
    spec = write_spec(tmp_path / "spec.yaml", kernel="faulty", problem={"n": 64},
                      space={"BLOCK": [64], "MODE": [0]}, run={"backend": "interpret"})
    loaded = load_spec(spec)
    run = rundir.RunDir(tmp_path / "run")
    run.path.mkdir()
    rundir.create(run, loaded, len(loaded.expand()), "interpret")
    marker = tmp_path / "imported"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run.spec.write_text(run.spec.read_text().replace("kernel: faulty", "kernel: evil:KERNEL"))
    capsys.readouterr()
    assert sweep_cli("resume", run.path) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{run.spec}: changed since this run started" in line
    assert not marker.exists()


@pytest.mark.slow  # four interpreter runs as processes (a kernel edited between them)
def test_after_a_kernel_edit_force_moves_the_old_run_aside_and_starts_anew(
        tmp_path):
    kernel = tmp_path / "edited_kernel.py"
    kernel.write_text("from sweep_kernels.faulty import KERNEL  # noqa: F401\n")
    write_spec(tmp_path / "spec.yaml", name="mine", kernel="edited_kernel:KERNEL",
               problem={"n": 64}, space={"BLOCK": [32, 64], "MODE": [0]},
               timing={"warmup_ms": 1, "rep_ms": 3},
               run={"backend": "interpret", "workers": 1, "finalists": 0})

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return sweep_proc(*args, "--runtime", "local", cwd=tmp_path)

    out = tmp_path / "run"
    assert sweep("run", "spec.yaml", "--out", "run").returncode == 0
    before = files(out)
    kernel.write_text(kernel.read_text() + "# edited\n")
    assert sweep("resume", "run").returncode == 2  # the kernel changed since
    refused = sweep("run", "spec.yaml", "--out", "run")
    assert refused.returncode == 2
    assert "--force" in refused.stderr and "moves it aside" in refused.stderr, refused.stderr
    assert files(out) == before
    done = sweep("run", "spec.yaml", "--out", "run", "--force")
    assert done.returncode == 0, done.stderr
    (aside,) = tmp_path.glob("run.replaced-*")
    assert f"moved it to {aside}" in done.stderr
    # The old run whole, where it was moved; a new one complete in its place.
    assert {k: v for k, v in files(aside).items() if k != ".sweep.lock"} == \
        {k: v for k, v in before.items() if k != ".sweep.lock"}
    assert_each_index_once(out, 2)
    assert json.loads((out / "run.json").read_text())["fingerprint"] != \
        json.loads((aside / "run.json").read_text())["fingerprint"]


# --- bad places ----------------------------------------------------------------------------
def test_a_read_only_run_directory_is_refused_on_resume_with_one_line(tmp_path,
                                                                       capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    assert sweep_cli("run", spec, "--out", tmp_path / "run", "--max-trials", "5") == 0
    with read_only_view(tmp_path / "run", tmp_path / "ro") as view:
        before = files(view)
        capsys.readouterr()
        assert sweep_cli("resume", view) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line == f"error: {view}: cannot write to the run directory " \
                       "(Read-only file system)"
        assert sweep_cli("run", spec, "--out", view / "new") == 2
        assert "--out: cannot create" in one_error_line(capsys.readouterr().err)
        assert files(view) == before


def test_an_out_path_that_is_not_utf8_is_refused_before_anything_is_made(tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    out = os.fsdecode(bytes(tmp_path / "run") + b"\xff")
    assert sweep_cli("run", spec, "--out", out) == 2
    assert "is not valid UTF-8" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_report_of_a_damaged_table_is_one_line(tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    assert sweep_cli("run", spec, "--out", tmp_path / "run", "--max-trials", "5") == 0
    (tmp_path / "run" / "trials.parquet").write_bytes(b"PAR1 not really")
    capsys.readouterr()
    assert sweep_cli("report", tmp_path / "run") == 2
    assert "trials.parquet: unreadable" in one_error_line(capsys.readouterr().err)



def test_a_session_works_on_absolute_paths_whatever_was_typed(stopped_run, tmp_path,
                                                                monkeypatch):
    # Ray's start changes the working directory for a moment (sweep/engines/ray/cluster.py), while
    # another thread may be reading the run directory: a relative path would read another.

    from sweep.run.session import Session

    shutil.copytree(stopped_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    session = Session.reopen(Path("run"), "sweep resume run")
    try:
        assert session.path == tmp_path / "run" and session.path.is_absolute()
    finally:
        session.opened.lock.release(remove=True)
    spec = stopped_run.parent / "spec.yaml"
    session = Session.start(spec, Path("new"), None, "sweep run")
    try:
        assert session.path == tmp_path / "new"
    finally:
        session.opened.lock.release(remove=True)


def test_a_directory_with_a_runs_files_but_no_run_json_is_neither_run_into_nor_resumed(
        tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text("# someone's own spec\n")
    assert sweep_cli("run", spec, "--out", out) == 2
    assert "holds a run's files but no run.json" in one_error_line(capsys.readouterr().err)
    assert sweep_cli("resume", out) == 2
    assert "not a sweep run directory (no run.json)" in one_error_line(capsys.readouterr().err)
    assert files(out) == {"spec.yaml": b"# someone's own spec\n"}


def test_only_failed_writes_in_the_run_directory_count_as_its_storage_errors(tmp_path):
    from storage.journal_file import JournalWriteError
    from sweep.run.rundir import storage_error

    inside = tmp_path / "run"
    assert storage_error(JournalWriteError(errno.ENOSPC, "no space", str(inside / "j")), inside)
    assert storage_error(OSError(errno.EROFS, "read-only", str(inside / "snapshot.json")),
                         inside)
    assert not storage_error(OSError(errno.ENOSPC, "no space", "/tmp/ray/session"), inside)
    assert not storage_error(OSError(errno.ENOSPC, "no space"), inside)  # names no file
    assert not storage_error(ValueError("no"), inside)


def test_an_atomic_write_that_fails_names_its_file(tmp_path):
    from storage.atomic import write_bytes_atomically

    with tmpfs(tmp_path / "disk", "64k") as disk, pytest.raises(OSError) as failed:
        write_bytes_atomically(disk / "snapshot.json", b"x" * 256 * 1024)
    assert failed.value.errno == errno.ENOSPC
    assert failed.value.filename == str(tmp_path / "disk" / "snapshot.json")


def test_a_default_run_directory_started_in_the_same_second_gets_its_own_name(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_spec(simulate_spec(tmp_path / "spec.yaml", space=SPACE))
    first = rundir.default_out(spec)
    first.mkdir(parents=True)
    second = rundir.default_out(spec)
    assert second != first and second.parent == first.parent


def test_a_run_named_after_its_spec_file_keeps_that_name_when_resumed(tmp_path,
                                                                      capsys):
    spec = tmp_path / "tuning.yaml"
    spec.write_text("kernel: matmul\nspace: {A: [1, 2, 3]}\nrun: {backend: simulate}\n")
    assert sweep_cli("run", spec, "--out", tmp_path / "run", "--max-trials", "1") == 0
    assert capsys.readouterr().out.startswith("sweep tuning: interrupted")
    assert sweep_cli("resume", tmp_path / "run") == 0
    assert capsys.readouterr().out.startswith("sweep tuning: complete")


def test_a_complete_run_from_before_best_per_device_type_resumes_as_intact(
        tmp_path, capsys):
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out) == 0
    # As this project wrote them before best.json and the snapshot had `by_device`.
    best = json.loads((out / "best.json").read_text())
    del best["by_device"]
    (out / "best.json").write_text(json.dumps(best, indent=2) + "\n")
    doc = json.loads((out / "snapshot.json").read_text())
    del doc["snapshot"]["by_device"]
    doc["sha256"] = snapshot_module.checksum(doc["snapshot"])
    (out / "snapshot.json").write_text(json.dumps(doc, indent=2) + "\n")
    before = files(out)
    capsys.readouterr()
    assert sweep_cli("resume", out) == 0
    assert "already complete (60 trials); nothing to do" in capsys.readouterr().out
    assert files(out) == before
    (out / "best.json").unlink()
    assert sweep_cli("resume", out) == 0
    rebuilt = json.loads((out / "best.json").read_text())
    assert rebuilt["by_device"] == {best["device"]: {
        "config": best["config"], "index": best["index"], "latency_ms": best["latency_ms"]}}


def test_a_start_killed_between_its_spec_and_run_json_is_run_into_again(tmp_path, capsys):
    """A SIGKILL after spec.yaml is written and before run.json leaves the sweep's own copy
    of this very spec alone: `sweep run` into it again starts the run (a random kill in
    start-up made the next `sweep run` refuse it); any other spec.yaml there is refused."""
    spec = simulate_spec(tmp_path / "spec.yaml", space=SPACE)
    done = tmp_path / "done"
    assert sweep_cli("run", spec, "--out", done) == 0
    capsys.readouterr()
    out = tmp_path / "run"
    out.mkdir()
    shutil.copyfile(done / "spec.yaml", out / "spec.yaml")  # what the start had written
    other = simulate_spec(tmp_path / "other.yaml", space={"A": [1, 2]})
    assert sweep_cli("run", other, "--out", out) == 2
    assert "holds a run's files but no run.json" in one_error_line(capsys.readouterr().err)
    assert sweep_cli("run", spec, "--out", out) == 0
    assert (out / "run.json").exists() and (out / "trials.parquet").exists()
