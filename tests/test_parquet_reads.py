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
