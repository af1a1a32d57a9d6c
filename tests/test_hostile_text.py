"""Text a kernel or a file hands the tool is input: a lone surrogate in a kernel's
exception (what an undecodable file name becomes in Python) is escaped before it is
journaled, and a crafted journal or attempt-log line is one line of refusal, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from conftest import sweep_proc, write_spec

TESTS = Path(__file__).parent
LONE = b"\xff".decode("utf-8", "surrogateescape")  # '\udcff'

# A third-party kernel whose grid raises, for one config, with a file name that is not
# UTF-8, as os.listdir gives it.
SURROGATE_KERNEL = f'''
from dataclasses import replace

from third_party_kernel import KERNEL, grid


def failing_grid(problem, config):
    if config["BLOCK_N"] == 64:
        raise FileNotFoundError("no such file: " + {LONE!r})
    return grid(problem, config)


SURROGATE = replace(KERNEL, grid=failing_grid)
'''


def test_a_kernel_error_holding_a_lone_surrogate_is_escaped_and_the_run_completes(tmp_path):
    shutil.copy(TESTS / "third_party_kernel.py", tmp_path)
    (tmp_path / "surrogate_kernel.py").write_text(SURROGATE_KERNEL)
    spec = write_spec(tmp_path / "spec.yaml", name="surrogate",
                      kernel="surrogate_kernel:SURROGATE", problem={"rows": 6, "cols": 50},
                      fixed={"HAS_BIAS": True}, space={"BLOCK_N": [64, 128]},
                      timing={"warmup_ms": 1, "rep_ms": 5}, run={"backend": "interpret"})
    out = tmp_path / "run"
    ran = sweep_proc("run", spec, "--out", out, "--runtime", "local", cwd=tmp_path,
                     timeout=300)
    assert ran.returncode == 0, ran.stderr
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert rows[0]["status"] != "ok" and rows[1]["status"] == "ok", rows
    assert "no such file: \\udcff" in rows[0]["error"]
    assert json.loads((out / "snapshot.json").read_text())["snapshot"]["state"] == "complete"
    for args in (("resume", out), ("report", out), ("best", out)):
        again = sweep_proc(*args, "--runtime", "local", cwd=tmp_path, timeout=300) \
            if args[0] == "resume" else sweep_proc(*args, cwd=tmp_path)
        assert again.returncode == 0, (args, again.stderr)
        assert "Traceback" not in again.stderr
