"""A process out of file descriptors (`ulimit -n 20`) is one line naming the cause and
what to do, exit 1, with nothing damaged: the run resumes once the limit is raised."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pyarrow.parquet as pq
from conftest import ROOT, simulate_spec, sweep_proc


def test_too_few_file_descriptors_is_one_line_and_the_run_resumes(tmp_path):
    spec = simulate_spec(tmp_path / "spec.yaml", simulate={"workers": 8})
    out = tmp_path / "run"

    def twenty_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))

    done = subprocess.run([sys.executable, "-m", "sweep", "run", spec, "--out", out,
                           "--runtime", "local"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, preexec_fn=twenty_files,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: too many open files: this process may open 20 files (`ulimit -n`); raise "
        f"it, e.g. `ulimit -n 4096`, then: sweep resume {out}")
    assert "Traceback" not in done.stderr
    again = sweep_proc("resume", out, "--runtime", "local")
    assert again.returncode == 0, again.stderr
    assert pq.read_table(out / "trials.parquet").num_rows == 40
