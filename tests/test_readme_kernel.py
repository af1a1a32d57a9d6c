"""The user-kernel example in README.md works as written: a module next to the spec,
named as "module:attr", run by the installed command from that directory — a directory
that also holds folders named like this project's packages, which must not replace them
(in the driver, in Ray's workers, or in the processes those start)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from conftest import ROOT, user_folders, write_spec

EXPECTED = [(64, "ok", "passed"), (128, "ok", "passed"), (96, "compile_error", "skipped")]


def users_directory(tmp_path: Path) -> Path:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own kernel", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "addkernel.py").write_text(code)
    write_spec(tmp_path / "spec.yaml", kernel="addkernel:KERNEL", problem={"n": 1000},
               space={"BLOCK": [64, 128, 96]}, timing={"warmup_ms": 1, "rep_ms": 5},
               run={"backend": "interpret"})
    return user_folders(tmp_path)


def run(command: list[str], cwd: Path) -> list[tuple]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(cwd / "run" / "trials.parquet").to_pylist()
    return [(r["BLOCK"], r["status"], r["validation"]) for r in rows]


def test_readme_kernel_example_sweeps_from_the_users_directory(tmp_path):
    here = users_directory(tmp_path)
    sweep = str(Path(sys.executable).parent / "sweep")  # the installed command, as README says
    assert run([sweep, "run", "spec.yaml", "--out", "run"], here) == EXPECTED
