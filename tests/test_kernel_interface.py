"""Real kernels as third parties write them (tests/third_party_kernel.py): keyword
arguments that are not tuned (`fixed:`), constraints over the problem's values, and a
kernel that fills two outputs, each validated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import simulate_spec, sweep_proc, write_spec

from actors import child
from actors.compile_pool import CompileJob, CompilePool
from actors.launcher import Launcher
from actors.protocol import CompileLimit, WorkerSettings
from actors.worker import launcher_payload
from sweep.spec import SpecError, load_spec

TESTS = Path(__file__).parent
KERNEL = "third_party_kernel:KERNEL"
PROBLEM = {"rows": 6, "cols": 50}


def kernel_spec(path: Path, **doc) -> Path:
    """A spec of the third-party kernel: its flag fixed, rows per program overriding the
    kernel's default, a constraint over a problem value."""
    return write_spec(path, **{
        "name": "bias-relu", "kernel": KERNEL, "problem": PROBLEM,
        "fixed": {"HAS_BIAS": True, "ROWS": 2},
        "space": {"BLOCK_N": [16, 32, 64, 128], "num_warps": [1, 2]},
        "constraints": ["BLOCK_N >= cols"],
        "timing": {"warmup_ms": 1, "rep_ms": 5}, "run": {"backend": "interpret"}, **doc})


def refused(spec: Path, key: str) -> str:
    """load_spec refuses spec in one line naming it and key; returns the line."""
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{spec}: {key}: "), message
    return message


# --- the spec -----------------------------------------------------------------------------
def test_fixed_values_go_to_the_spec_merged_over_the_kernels_but_not_into_configs(tmp_path):
    spec = load_spec(kernel_spec(tmp_path / "s.yaml"))
    assert dict(spec.fixed_as_written) == {"HAS_BIAS": True, "ROWS": 2}
    assert dict(spec.fixed) == {"scale": 0.5, "ROWS": 2, "HAS_BIAS": True}
    space = spec.expand()
    assert space.names == ("BLOCK_N", "num_warps")
    assert space.config(0) == {"BLOCK_N": 64, "num_warps": 1}


def test_a_kernel_default_the_spec_tunes_is_dropped_from_the_fixed_values(tmp_path):
    spec = load_spec(kernel_spec(tmp_path / "s.yaml", fixed={"HAS_BIAS": True},
                                 space={"BLOCK_N": [64], "ROWS": [1, 2]}))
    assert dict(spec.fixed) == {"scale": 0.5, "HAS_BIAS": True}
    assert [spec.expand().config(i)["ROWS"] for i in range(2)] == [1, 2]


def test_a_required_flag_needs_a_value_list_or_a_fixed_value(tmp_path):
    spec = kernel_spec(tmp_path / "s.yaml", fixed={"ROWS": 2})
    assert refused(spec, "space").endswith(
        "kernel bias_relu needs a value list (or a value under fixed:) for HAS_BIAS")


def test_a_fixed_name_must_be_a_keyword_argument_of_the_kernel(tmp_path):
    spec = kernel_spec(tmp_path / "s.yaml", fixed={"HAS_BIAS": True, "ACTIVATION": "relu"})
    assert "not a parameter of kernel bias_relu (expected one of BLOCK_N, HAS_BIAS, ROWS, " \
           "scale)" in refused(spec, "fixed.ACTIVATION")
    # A pointer, size or stride is launch_args' to pass (by position): fixing it would
    # fail every trial with "multiple values for argument".
    positional = kernel_spec(tmp_path / "p.yaml", fixed={"HAS_BIAS": True, "n_cols": 50})
    assert "kernel bias_relu gets it from launch_args, by position; fixed: takes its " \
           "tl.constexpr parameters and those with a default (BLOCK_N, HAS_BIAS, ROWS, " \
           "scale)" in refused(positional, "fixed.n_cols")
    # A backend that runs no kernel code imports none, so checks no name against one.
    simulate = kernel_spec(tmp_path / "sim.yaml", fixed={"ACTIVATION": "relu"},
                           run={"backend": "simulate"})
    assert dict(load_spec(simulate).fixed) == {"ACTIVATION": "relu"}


def test_a_kernel_default_for_no_parameter_of_its_function_is_refused(tmp_path):
    spec = kernel_spec(tmp_path / "s.yaml", kernel="third_party_kernel:MISSPELT_DEFAULT")
    assert "kernel bias_relu's own fixed value 'SCALE': 0.5: expected one of its " \
           "function's parameters (BLOCK_N, HAS_BIAS, ROWS, scale)" in refused(spec, "kernel")


def test_a_changed_fixed_value_changes_both_fingerprints(tmp_path):
    one = load_spec(kernel_spec(tmp_path / "one.yaml"))
    other = load_spec(kernel_spec(tmp_path / "other.yaml", fixed={"HAS_BIAS": False,
                                                                  "ROWS": 2}))
    assert one.fingerprint != other.fingerprint
    assert one.declared_fingerprint != other.declared_fingerprint
    assert one.identity()["fixed"] == {"HAS_BIAS": True, "ROWS": 2, "scale": 0.5}


def test_the_declared_fingerprint_is_the_same_with_or_without_the_kernel(tmp_path):
    spec = kernel_spec(tmp_path / "s.yaml")
    imported, not_imported = load_spec(spec), load_spec(spec, import_kernel=False)
    assert imported.declared_fingerprint == not_imported.declared_fingerprint
    assert dict(not_imported.fixed) == {"HAS_BIAS": True, "ROWS": 2}
    # With no fixed values written, the kernel's own defaults leave no trace either.
    bare = kernel_spec(tmp_path / "bare.yaml", fixed=None,
                       space={"BLOCK_N": [64], "HAS_BIAS": [True]})
    assert load_spec(bare).declared_fingerprint == \
        load_spec(bare, import_kernel=False).declared_fingerprint
    assert "fixed" not in load_spec(bare, import_kernel=False).identity()


def test_the_normalised_spec_keeps_the_fixed_values_and_both_fingerprints(tmp_path):
    original = load_spec(kernel_spec(tmp_path / "s.yaml"), backend="interpret")
    assert original.overridden
    stored = tmp_path / "stored.yaml"
    stored.write_text(original.as_yaml())
    reloaded = load_spec(stored)
    assert dict(reloaded.fixed_as_written) == {"HAS_BIAS": True, "ROWS": 2}
    assert reloaded.fingerprint == original.fingerprint
    assert reloaded.declared_fingerprint == original.declared_fingerprint


PINNED = """\
name: pinned
kernel: matmul
problem: {M: 64, N: 64, K: 64, dtype: float16}
space:
  BLOCK_M: [32, 64]
  BLOCK_N: [32]
  BLOCK_K: [32]
  GROUP_M: [4]
  num_warps: [4]
constraints: ["BLOCK_M <= 64"]
run: {backend: interpret}
"""
PINNED_SIMULATE = """\
name: pinned-sim
kernel: matmul
space: {A: [1, 2, 3], B: [x, y]}
constraints: ["A < 3"]
run: {backend: simulate, seed: 3}
simulate: {trial_ms: 2, fail_rate: 0.1}
"""


def test_specs_without_fixed_values_keep_the_fingerprints_they_had_before(tmp_path):
    # Computed before `fixed:` existed: runs made then must still resume.
    (tmp_path / "a.yaml").write_text(PINNED)
    (tmp_path / "b.yaml").write_text(PINNED_SIMULATE)
    assert load_spec(tmp_path / "a.yaml").declared_fingerprint == "baebdb06636ac078"
    simulated = load_spec(tmp_path / "b.yaml")
    assert (simulated.fingerprint, simulated.declared_fingerprint) == \
        ("8985230835a1a2a7", "e4ce06649535b7a0")


# --- constraints over problem and fixed values --------------------------------------------
def test_a_constraint_over_a_problem_value_filters_the_space(tmp_path):
    counts = {}
    for cols in (10, 50, 100):
        spec = kernel_spec(tmp_path / f"s{cols}.yaml", problem={**PROBLEM, "cols": cols})
        counts[cols] = len(load_spec(spec).expand())
    # BLOCK_N of 16, 32, 64, 128, each with two num_warps
    assert counts == {10: 8, 50: 4, 100: 2}


def test_a_space_no_block_of_which_covers_a_row_is_refused(tmp_path):
    spec = load_spec(kernel_spec(tmp_path / "s.yaml", problem={**PROBLEM, "cols": 200}))
    with pytest.raises(SpecError, match="constraints: leave no config of the 8"):
        spec.expand()


@pytest.mark.parametrize(("constraint", "configs"), [
    ("BLOCK_N >= cols", 4),
    ("BLOCK_N * ROWS <= 128", 2),  # a fixed value as written
    ("HAS_BIAS and num_warps == 2", 2),  # a boolean one
    ("dtype == 'float32' and BLOCK_N < 2 * cols", 2),  # a string problem value
    ("BLOCK_N >= cols and dtype != 'float32'", None),  # false for every config
])
def test_constraints_read_problem_and_fixed_values_as_constants(tmp_path, constraint, configs):
    spec = load_spec(kernel_spec(tmp_path / "s.yaml", problem={**PROBLEM, "dtype": "float32"},
                                 constraints=["BLOCK_N >= cols", constraint]))
    if configs is None:
        with pytest.raises(SpecError, match="leave no config"):
            spec.expand()
    else:
        assert len(spec.expand()) == configs


def test_a_parameter_wins_over_a_problem_value_of_its_name(tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": [1, 2, 3]}, problem={"A": 100},
                         constraints=["A < 3"])
    assert len(load_spec(spec).expand()) == 2


def test_a_problem_value_only_the_kernel_defaults_is_unknown_to_constraints(tmp_path):
    spec = kernel_spec(tmp_path / "s.yaml", problem={"rows": 6})
    assert refused(spec, "constraints[0]").endswith(
        "'BLOCK_N >= cols' unknown name 'cols' (expected a parameter (BLOCK_N, num_warps), "
        "or a value written under problem: (rows) or fixed: (HAS_BIAS, ROWS))")


def test_problem_values_in_constraints_are_typed_as_parameters_are(tmp_path):
    spec = kernel_spec(tmp_path / "s.yaml", problem={**PROBLEM, "dtype": "float32"},
                       constraints=["BLOCK_N >= dtype"])
    assert refused(spec, "constraints[0]").endswith(
        ">= needs two numbers or two strings, got a number and a string")


# --- the kernel launched: fixed values and two outputs ------------------------------------
def launcher(kernel: str = KERNEL, **fixed) -> Launcher:
    """A kernel-launching process (Triton's interpreter) as a worker makes it."""
    settings = WorkerSettings(
        backend="interpret", kernel=kernel, problem=PROBLEM, trial_timing=(1, 3),
        finalist_timing=(1, 3), tolerance=(0.01, 0.01), seed=0, simulate={},
        kernel_path=str(TESTS), fixed=fixed)
    return Launcher(launcher_payload(settings))


@pytest.fixture(scope="module")
def launchers():
    """Started together: each imports torch and Triton for seconds."""
    started = {
        "right": launcher(HAS_BIAS=True, ROWS=2),
        "no bias": launcher(HAS_BIAS=False, ROWS=2),
        "second wrong": launcher("third_party_kernel:SECOND_WRONG", HAS_BIAS=True),
        "one reference": launcher("third_party_kernel:ONE_REFERENCE", HAS_BIAS=True),
    }
    yield started
    for one in started.values():
        stop(one)


def stop(one: Launcher) -> None:
    if one._child is not None:
        child.kill(one._child)


def test_fixed_values_reach_every_launch_and_the_grid(launchers):
    # Validation passes only with the bias added, two rows per program (the grid reads
    # ROWS) and the kernel record's scale of 0.5 rather than the function's default of 1.
    right = launchers["right"]
    outcome = right.run_trial({"BLOCK_N": 64})
    assert (outcome.status, outcome.validation) == ("ok", "passed"), outcome
    # Re-timing the finalists launches with them too (HAS_BIAS has no default).
    retimed = right.retime([{"BLOCK_N": 64}], rounds=1)
    (timing,) = retimed.finalists
    assert timing.median_ms > 0
    # A kernel with no torch baseline has its validation reference timed beside, so named.
    assert retimed.baseline is not None and retimed.baseline.median_ms > 0
    assert retimed.baseline_of == "reference"


def test_a_wrong_fixed_value_reaches_the_kernel_and_fails_validation(launchers):
    outcome = launchers["no bias"].run_trial({"BLOCK_N": 64})
    assert (outcome.status, outcome.validation) == ("incorrect", "failed"), outcome
    assert outcome.error.startswith("output 1 of 2 differs from the reference: max abs error")


def test_each_output_is_validated_on_its_own(launchers):
    outcome = launchers["second wrong"].run_trial({"BLOCK_N": 64})
    assert (outcome.status, outcome.validation) == ("incorrect", "failed"), outcome
    assert outcome.error == ("output 2 of 2 differs from the reference: max abs error 1 "
                             "(rtol=0.01, atol=0.01)")


def test_a_reference_with_fewer_outputs_than_the_launch_is_a_runtime_error(launchers):
    outcome = launchers["one reference"].run_trial({"BLOCK_N": 64})
    assert (outcome.status, outcome.validation) == ("runtime_error", "skipped"), outcome
    assert outcome.error == ("the kernel's reference returned 1 output(s) and its "
                             "launch_args 2: reference must return one tensor per output, "
                             "in launch_args' order")


def test_a_single_output_kernel_keeps_its_error_text():
    one = Launcher(launcher_payload(WorkerSettings(
        backend="interpret", kernel="faulty", problem={"n": 100}, trial_timing=(1, 3),
        finalist_timing=(1, 3), tolerance=(0.01, 0.01), seed=0, simulate={})))
    try:
        outcome = one.run_trial({"BLOCK": 64, "MODE": 1})
    finally:
        stop(one)
    assert outcome.status == "incorrect"
    assert outcome.error.startswith("output differs from the reference: max abs error ")


def test_compiles_get_the_fixed_values_and_the_grid_sees_them(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inputs on the CPU
    pool = CompilePool(1, CompileJob("third_party_kernel:ECHO_COMPILE", PROBLEM,
                                     kernel_path=str(TESTS), fixed={"HAS_BIAS": True, "ROWS": 3}),
                       CompileLimit(60))
    try:
        pool.submit(0, {"BLOCK_N": 64, "num_warps": 2})
        while (got := pool.take([0])) is None:
            pool.wait(0.05)
    finally:
        pool.close()
    keywords = {"BLOCK_N": 64, "HAS_BIAS": True, "ROWS": 3, "num_warps": 2, "scale": 0.5}
    assert f"compiled with {json.dumps(keywords, sort_keys=True)} grid (2,)" in got[1].error


# --- a sweep ------------------------------------------------------------------------------
def test_a_sweep_of_the_third_party_kernel_validates_both_outputs(tmp_path):
    # As a user runs it: the kernel module next to the spec, the command run from there.
    shutil.copy(TESTS / "third_party_kernel.py", tmp_path)
    spec = kernel_spec(tmp_path / "spec.yaml", space={"BLOCK_N": [16, 32, 64, 128]})
    result = sweep_proc("run", spec, "--out", tmp_path / "run", "--runtime", "local",
                        cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    table = pq.read_table(tmp_path / "run" / "trials.parquet")
    rows = table.to_pylist()
    # HAS_BIAS (no default) and ROWS (read by the grid) reached the kernel, and both
    # outputs matched their references.
    assert [(r["BLOCK_N"], r["status"], r["validation"]) for r in rows] == [
        (64, "ok", "passed"), (128, "ok", "passed")]
    assert not {"HAS_BIAS", "ROWS", "scale"} & set(table.column_names)
    assert [json.loads(r["config"]) for r in rows] == [{"BLOCK_N": 64}, {"BLOCK_N": 128}]
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert list(best["config"]) == ["BLOCK_N"]
    assert [list(f["config"]) for f in best["finalists"]] == [["BLOCK_N"], ["BLOCK_N"]]


def test_a_kernel_that_prints_at_import_leaves_the_commands_stdout_to_the_summary(tmp_path):
    # 20 MB at import, from the command's own import and every worker's
    (tmp_path / "noisy_kernel.py").write_text(
        "print('x' * 20_000_000)\nfrom sweep_kernels.matmul import KERNEL  # noqa\n")
    spec = write_spec(tmp_path / "s.yaml", name="noisy", kernel="noisy_kernel:KERNEL",
                      problem={"M": 16, "N": 16, "K": 16, "dtype": "float32"},
                      space={"BLOCK_M": [16], "BLOCK_N": [16], "BLOCK_K": [16],
                             "GROUP_M": [1]},
                      timing={"warmup_ms": 1, "rep_ms": 3, "screen": "off"},
                      run={"backend": "interpret", "finalists": 0})
    done = sweep_proc("run", spec, "--out", tmp_path / "run", "--runtime", "local",
                      cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "x" * 100 not in done.stdout and len(done.stdout) < 10_000, len(done.stdout)
    assert "results: " in done.stdout
    assert "printed 19,996,001 more characters while it was imported; not shown" in \
        done.stderr
