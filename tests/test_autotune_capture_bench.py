"""benchmarks/autotune_capture.py's readings: Triton's own picks from the lines its
autotuner prints (a real program under the interpreter), each tuned key's margin over the
exhaustive best in a run's trials.parquet, and the steady-step pairs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweep.autotune.hook import config_form

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is the checkout's, not an installed package
from benchmarks.autotune_capture_keys import (  # noqa: E402
    per_key,
    program_lines,
    steady_pairs,
    triton_picks,
)


def test_triton_picks_and_program_lines_are_read_from_a_real_autotuned_program() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_PRINT_AUTOTUNING": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "benchmarks/programs/tiny_step.py", "--sizes",
                           "40,300", "--steps", "1"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300, check=True)
    lines = done.stdout.splitlines()
    picks = triton_picks(lines)
    from benchmarks.programs.tiny_kernels import scaled_add_kernel

    forms = {config_form(c) for c in scaled_add_kernel.configs}
    assert [(p["function"], p["key"][0]) for p in picks] == [("scaled_add_kernel", 40),
                                                             ("scaled_add_kernel", 300)]
    assert all(config_form(p["config"]) in forms for p in picks)
    assert [p["n"] for p in program_lines(lines)] == [40, 300]


def _run_dir(tmp_path: Path) -> Path:
    """A run of two captured keys as `sweep run` leaves it: trials.parquet (the columns
    read) and best.json's by_problem, the second key's pick not its fastest trial."""
    configs = [{"BLOCK": b, "num_warps": 4, "num_stages": 1, "num_ctas": 1} for b in (16, 32)]
    latency = [2.0, 1.0, 1.00, 1.05]
    rows = {"index": list(range(4)), "config": [json.dumps(c) for c in configs * 2],
            "status": ["ok"] * 4, "validation": ["passed"] * 4, "latency_ms": latency}
    pq.write_table(pa.table(rows), tmp_path / "trials.parquet")
    problems = [{"kernel": "pkg.mod:scaled_add_kernel", "key": f"N={n}; float32"}
                for n in (40, 300)]
    by_problem = [{"problem": problems[0], "first_index": 0, "configs": 2, "index": 1,
                   "config": configs[1], "latency_ms": 0.99},
                  {"problem": problems[1], "first_index": 2, "configs": 2, "index": 3,
                   "config": configs[1], "latency_ms": 1.01}]
    (tmp_path / "best.json").write_text(json.dumps({"by_problem": by_problem}))
    return tmp_path


def test_each_keys_pick_is_measured_against_the_fastest_of_all_its_trials(
        tmp_path: Path) -> None:
    keys = per_key(_run_dir(tmp_path), [])
    assert [k["best"]["index"] for k in keys] == [1, 2]
    assert keys[0]["pick"]["margin"] == 0.0 and keys[0]["pick"]["within_target"]
    assert keys[1]["pick"]["margin"] == pytest.approx(0.05)
    assert not keys[1]["pick"]["within_target"]


def test_tritons_own_pick_is_placed_among_the_same_trials_by_kernel_and_key_values(
        tmp_path: Path) -> None:
    printed = {"function": "scaled_add_kernel", "tune_s": 3.0,
               "config": {"BLOCK": 16, "num_warps": 4, "num_ctas": 1, "num_stages": 1,
                          "maxnreg": None}}
    picks = [{**printed, "key": [300, "torch.float32"]},
             {**printed, "function": "other_kernel", "key": [40, "torch.float32"]}]
    keys = per_key(_run_dir(tmp_path), picks)
    assert "triton_pick" not in keys[0]  # no pick of this kernel for N=40
    assert keys[1]["triton_pick"]["index"] == 2
    assert keys[1]["triton_pick"]["margin"] == 0.0


def test_steady_pairs_give_the_median_of_ours_over_tritons_per_size() -> None:
    def run(*steps: float) -> list[dict[str, object]]:
        return [{"program": "p", "n": n, "steady_step_s": s} for n, s in zip((1, 2), steps)]

    pairs = steady_pairs([run(1.0, 2.0), run(1.0, 2.0), run(1.0, 2.0)],
                         [run(1.01, 2.2), run(0.9, 2.1), run(1.0, 2.0)])
    assert [p["size"] for p in pairs] == [{"n": 1}, {"n": 2}]
    assert pairs[0]["median_ratio"] == pytest.approx(1.0) and pairs[0]["within_target"]
    assert pairs[1]["median_ratio"] == pytest.approx(1.05) and not pairs[1]["within_target"]


@pytest.mark.slow
def test_the_cpu_dry_run_captures_tunes_and_loads_the_tiny_program_without_tuning_again(
        tmp_path: Path) -> None:
    """The whole benchmark on the tiny program under the interpreter: every command exits
    0, the loaded program tunes no key itself, and its results match Triton's picks'."""
    subprocess.run([sys.executable, "benchmarks/autotune_capture.py", "--cpu", "--rounds", "0",
                    "--out", str(tmp_path)], cwd=ROOT, env={**os.environ,
                    "PYTHONPATH": str(ROOT)}, check=True, timeout=900, capture_output=True)
    (result,) = tmp_path.glob("autotune_capture_cpu-*.json")
    tiny = json.loads(result.read_text())["programs"]["tiny"]
    assert [tiny["ours"][s]["rc"] for s in ("capture", "run", "exec")] == [0, 0, 0]
    assert tiny["targets"]["exec_triton_tuned"] == 0
    assert tiny["targets"]["capture_triton_tuned"] == 0
    assert [k["ok"] > 0 and "pick" in k for k in tiny["per_key"]] == [True, True]
    steady = tiny["steady"]
    assert [s["checksums"]["ours"] for s in steady] == [s["checksums"]["triton"] for s in steady]
