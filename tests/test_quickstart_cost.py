"""What the quickstart's command spends its CPU on, on a 2-core machine where its workers
import torch meanwhile (BENCHMARKS.md, the quickstart against the import): the driver
checks the spec against a built-in kernel without importing torch, pyarrow does not import
pandas in the command's process, and an interpreted trial's validating launch is its
timing's estimate and first sample."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.timing import time_wall

ROOT = Path(__file__).resolve().parent.parent


def python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("spec", ["quickstart.yaml", "softmax.yaml"])
def test_checking_a_spec_against_a_built_in_kernel_imports_no_torch(spec):
    said = python("import sys; from sweep.spec import load_spec; "
                  f"spec = load_spec('configs/{spec}', backend='interpret'); "
                  "print(bool(spec.problem), spec.kernel_source != '', 'torch' in sys.modules)")
    assert said == "True True False"


def test_the_built_in_kernels_count_the_bytes_each_dtype_moves_as_torch_does():
    import torch

    from sweep_kernels.matmul import KERNEL as MATMUL
    from sweep_kernels.softmax import KERNEL as SOFTMAX

    assert MATMUL.bytes_moved is not None and SOFTMAX.bytes_moved is not None
    for dtype in ("float16", "bfloat16", "float32"):
        size = torch.finfo(getattr(torch, dtype)).bits / 8
        p = {"M": 64, "N": 32, "K": 16, "dtype": dtype}
        assert MATMUL.bytes_moved(p) == (64 * 16 + 16 * 32 + 64 * 32) * size
        assert SOFTMAX.bytes_moved({"rows": 8, "cols": 16, "dtype": dtype}) == 2 * 8 * 16 * size


def test_the_command_keeps_pyarrow_from_importing_pandas_and_to_pandas_still_works():
    pytest.importorskip("pandas")
    said = python("import sys; import sweep.command; import pyarrow as pa; "
                  "t = pa.table({'a': [1, 2]}); print('pandas' in sys.modules); "
                  "print(type(t.to_pandas()).__name__, 'pandas' in sys.modules)")
    assert said.splitlines() == ["False", "DataFrame True"]


def test_a_timing_given_the_first_launchs_time_spends_no_launch_on_an_estimate():
    # The interpreter's validating launch (50 ms) is the estimate and, with no warm-up
    # due, the first of the three samples; a warm-up due comes between it and them.
    calls: list[int] = []
    t = time_wall(lambda: calls.append(1), warmup_ms=0, rep_ms=0, first_ms=50.0)
    assert len(calls) == 2
    assert t.p80_ms >= 0.6 * 50.0  # the 50 ms first sample is among the three
    calls.clear()
    time_wall(lambda: calls.append(1), warmup_ms=60, rep_ms=0, first_ms=50.0)
    assert len(calls) == 4  # one warm-up, three samples of its own
    calls.clear()
    time_wall(lambda: calls.append(1), warmup_ms=0, rep_ms=0)
    assert len(calls) == 4  # one estimate, then the three
