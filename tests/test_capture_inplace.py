"""Kernels that write their own inputs (tests/programs/inplace_kernels.py): one doubled in
place under restore_value, one adding into an output it reads. Each config is validated on
what its launch wrote (neither NaN put into an input it reads, nor a restore that undoes the
write), and the loaded program launches each kernel's tuned config."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
from conftest import sweep_proc

PROGRAMS = Path(__file__).parent / "programs"
ROOT = Path(__file__).resolve().parents[1]


def test_kernels_that_write_their_inputs_are_validated_tuned_and_loaded(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    for name in ("inplace_app.py", "inplace_kernels.py"):
        shutil.copy(PROGRAMS / name, app)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    captured = sweep_proc("capture", "--out", tmp_path / "cap", "--", sys.executable,
                          "inplace_app.py", cwd=app, env=env)
    assert captured.returncode == 0, captured.stderr
    ran = sweep_proc("run", tmp_path / "cap" / "spec.yaml", "--out", tmp_path / "run",
                     cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [(r["status"], r["validation"]) for r in rows] == [("ok", "passed")] * 4
    best = {p["problem"]["kernel"]: p["config"]["BLOCK"] for p in
            json.loads((tmp_path / "run" / "best.json").read_text())["by_problem"]}
    loaded = sweep_proc("exec", tmp_path / "run", "--", sys.executable, "inplace_app.py",
                        cwd=app, env=env)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["launched", str(best["inplace_kernels:double"]),
                                     str(best["inplace_kernels:accumulate"])]
