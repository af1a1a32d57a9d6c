"""Every reader of a run's Parquet reads through the descriptor it checked: a FIFO put
in place of trials.parquet after any check by path is refused, never blocked on (pyarrow's
own open of the path would block past SIGTERM and SIGINT)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, simulate_spec, sweep_in

# Run in a process of its own, bounded by a generous timeout: a reader that blocks on the
# FIFO is a test that fails, not one that hangs. Every stat of the table by path swaps a
# FIFO in for it first (the check passes, on the regular file), as a race would.
RACE = '''
import os, stat as modes, sys
from pathlib import Path

target = sys.argv[1]
real_stat = os.stat


def stat(path, *args, **kwargs):
    result = real_stat(path, *args, **kwargs)
    if os.fspath(path) == target and modes.S_ISREG(result.st_mode):
        os.unlink(target)
        os.mkfifo(target)
    return result


os.stat = stat
out, reader = Path(target).parent, sys.argv[2]
try:
    if reader == "table":
        from storage.table import records_from_table
        records_from_table(target)
    elif reader == "report":
        from sweep.report.analysis import analyse
        analyse(out)
    elif reader == "warm start":
        from storage.cache import CacheEntry
        from sweep.search.warm_start import top_configs
        top_configs(CacheEntry("matmul", "s", {}, "simulate", "d", {"A": 0}, 1.0, "f",
                               str(out), False, 0.0), 3)
    elif reader == "best":
        from sweep.best import _merged_problem
        from sweep.run.rundir import RunDir
        _merged_problem(RunDir(out), "0123456789abcdef", {})
except Exception as e:
    print(f"{type(e).__name__}: {e}")
print("returned")
'''


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("run")
    spec = simulate_spec(where / "spec.yaml")
    done = sweep_in("run", spec, "--out", where / "run", "--runtime", "local")
    assert done.returncode == 0, done.stderr
    return where / "run"


@pytest.mark.parametrize("reader", ["table", "report", "warm start", "best"])
def test_a_fifo_swapped_in_after_the_check_is_refused_not_blocked_on(run_dir, tmp_path,
                                                                      reader):
    out = tmp_path / "run"
    out.mkdir()
    for f in run_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes()) if f.is_file() else None
    target = out / "trials.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", RACE, str(target), reader], env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{reader}: blocked in open() on the FIFO")
    assert done.returncode == 0 and done.stdout.endswith("returned\n"), done.stderr
    # A reader that checked by path met the FIFO, and named it; one that reads through
    # the descriptor alone read the table (and the best of another run refuses it).
    if target.is_fifo():
        assert f"{target}: not a regular file but a FIFO" in done.stdout, done.stdout
    assert "RecursionError" not in done.stdout
    assert "Traceback" not in done.stderr


def test_reading_a_fifo_as_parquet_is_one_line_naming_it(tmp_path):
    from storage.readback import ReadBackError
    from storage.table import read_parquet

    fifo = tmp_path / "trials.parquet"
    os.mkfifo(fifo)
    with pytest.raises(ReadBackError, match=f"^{fifo}: not a regular file but a FIFO$"):
        read_parquet(fifo)


def test_an_empty_list_of_columns_reads_none_of_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.table import read_parquet

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), path)
    assert read_parquet(path, columns=[]).column_names == []
    assert read_parquet(path, columns=["b"]).column_names == ["b"]
    assert read_parquet(path).column_names == ["a", "b"]


def test_a_schema_read_of_a_fifo_is_one_line_naming_it(tmp_path):
    from storage.readback import ReadBackError
    from storage.table import read_parquet_schema

    fifo = tmp_path / "trials.parquet"
    os.mkfifo(fifo)
    with pytest.raises(ReadBackError, match=f"^{fifo}: not a regular file but a FIFO$"):
        read_parquet_schema(fifo)


@pytest.mark.parametrize("reader", ["best", "resume"])
def test_a_tables_metadata_is_read_from_memory_pyarrow_owns_not_every_column(
        run_dir, monkeypatch, reader):
    """`sweep best RUN` and a resume that says what changed read the table's schema alone,
    from bytes pyarrow owns: a Python file object handed to pyarrow is released on one of
    its threads, which aborts an exiting interpreter."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.run.rundir import RunDir

    sources: list[object] = []
    real = pq.read_schema
    monkeypatch.setattr(pq, "read_schema", lambda source, *a, **k: (
        sources.append(source), real(source, *a, **k))[1])
    real_table = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: (
        sources.append("read_table"), real_table(*a, **k))[1])
    run = RunDir(run_dir)
    if reader == "best":
        from sweep.best import _merged_problem
        from sweep.run.rundir import read_meta

        _merged_problem(run, read_meta(run)["fingerprint"], {})
    else:
        from sweep.run.opening import _what_changed
        from sweep.spec import load_spec

        _what_changed(run, "0123456789abcdef", load_spec(run_dir / "spec.yaml"))
    assert len(sources) == 1 and isinstance(sources[0], pa.NativeFile), sources
