"""The user-kernel example in README.md works as written: a module next to the spec,
named as "module:attr", run by the installed command from that directory."""

import re

import pyarrow.parquet as pq
from conftest import ROOT, sweep_proc, write_spec


def test_readme_kernel_example_sweeps_from_the_users_directory(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own kernel", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "addkernel.py").write_text(code)
    write_spec(tmp_path / "spec.yaml", kernel="addkernel:KERNEL", problem={"n": 1000},
               space={"BLOCK": [64, 128, 96]}, timing={"warmup_ms": 1, "rep_ms": 5},
               run={"backend": "interpret"})
    result = sweep_proc("run", "spec.yaml", "--out", "run", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [(r["BLOCK"], r["status"], r["validation"]) for r in rows] == [
        (64, "ok", "passed"), (128, "ok", "passed"), (96, "compile_error", "skipped")]
