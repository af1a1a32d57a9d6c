"""Every spec mistake: exit 2, one line naming the file and the key, no traceback, nothing
written, and all of it before Ray starts."""

from pathlib import Path

import pytest
from conftest import ROOT, sweep_cli, sweep_proc

from sweep.spec import SpecError, load_spec

GOOD = """\
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

CASES = [
    # (replace this, with this, key named in the message, what it says)
    ("kernel: matmul", "kernel: matmull", "kernel", "built-in kernel"),
    ("kernel: matmul", "kernel: nosuch.module:KERNEL", "kernel", "cannot import"),
    ("kernel: matmul\n", "", "kernel", "required key is missing"),
    ("run: {backend: interpret}", "run: {backend: interpret, trial_timeout: 5}",
     "run.trial_timeout", "unknown key"),
    ("run: {backend: interpret}", "run: {backend: gpu}", "run.backend", "one of"),
    ("run: {backend: interpret}", "run: {backend: interpret, max_retries: -1}",
     "run.max_retries", "integer >= 0"),
    ("run: {backend: interpret}", "run: {backend: interpret, trial_timeout_s: yes}",
     "run.trial_timeout_s", "number > 0"),
    ("GROUP_M: [4]", "GROUP_M: 4", "space.GROUP_M", "write [4]"),
    ("GROUP_M: [4]", "GROUP_M: []", "space.GROUP_M", "at least one value"),
    ("GROUP_M: [4]", "GROUP_M: [4, 4]", "space.GROUP_M", "listed twice"),
    ("GROUP_M: [4]", "GROUP_M: [4, wide]", "space.GROUP_M", "one type"),
    ("GROUP_M: [4]", "GROUP_M: [4]\n  status: [1]", "space.status", "collides"),
    ("GROUP_M: [4]", "GROUP_M: [4]\n  BLOK_M: [1]", "space.BLOK_M", "not a parameter"),
    ("  GROUP_M: [4]\n", "", "space", "needs a value list (or a value under fixed:) for GROUP_M"),
    ('["BLOCK_M <= 64"]', '["BLOCK_M <= "]', "constraints[0]", "does not parse"),
    ('["BLOCK_M <= 64"]', '["BLOCK_X <= 64"]', "constraints[0]",
     "unknown name 'BLOCK_X' (expected a parameter (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, "
     "num_warps), or a value written under problem: (M, N, K, dtype) or fixed: (none))"),
    ('["BLOCK_M <= 64"]', '["open(BLOCK_M)"]', "constraints[0]", "not allowed"),
    ('["BLOCK_M <= 64"]', '["BLOCK_M > 64"]', "constraints", "leave no config"),
    ("dtype: float16", "dtype: float8", "problem.dtype", "one of"),
    ("dtype: float16", "dtype: bfloat16", "problem.dtype", "interpreter"),
    ("M: 64,", "M: 64.5,", "problem.M", "expected int"),
    ("M: 64,", "Q: 64,", "problem.Q", "unknown key"),
    ("run: {backend: interpret}", "run: {backend: interpret}\nrun: {seed: 1}", "line 11",
     "given twice"),
    ("run: {backend: interpret}", "run: {backend: interpret", "line", "invalid YAML"),
    ("run: {backend: interpret}", "runs: {backend: interpret}", "runs", "unknown key"),
    ("run: {backend: interpret}", "run: {backend: simulate}\nsimulate: {fail_rate: 1.5}",
     "simulate.fail_rate", "from 0 to 1"),
    ("run: {backend: interpret}", "run: {backend: interpret, compile_timeout_s: soon}",
     "run.compile_timeout_s", "auto, off or a number"),
    ("run: {backend: interpret}", "run: {backend: interpret}\nreplay: foo", "replay",
     "expected a mapping"),
    ("run: {backend: interpret}", "run: {backend: replay}\nreplay: {tabel: x}",
     "replay.tabel", "unknown key"),
    ("run: {backend: interpret}", "run: {backend: replay}", "replay.table",
     "required for run.backend: replay"),
    ("run: {backend: interpret}", "run: {backend: replay}\nreplay: {table: none.parquet}",
     "replay.table", "cannot read"),
    ("run: {backend: interpret}", "run: {backend: interpret}\ntiming: {screen: {rep: 5}}",
     "timing.screen.rep", "unknown key"),
    ("run: {backend: interpret}", "run: {backend: interpret}\ntiming: {screen: {rep_ms: 0}}",
     "timing.screen.rep_ms", "number > 0"),
    ("run: {backend: interpret}", "run: {backend: interpret}\ntiming: {screen: fast}",
     "timing.screen", "expected a mapping"),
    ("run: {backend: interpret}", "run: {backend: interpret, start_timeout_s: 0}",
     "run.start_timeout_s", "number > 0"),
    # Each below once escaped as a traceback or a misleading message.
    ("GROUP_M: [4]", "GROUP_M: [4]\n  ? [a, b]\n  : [1]", "line 8",
     "mapping keys must be strings, got a sequence"),
    ("GROUP_M: [4]", "GROUP_M: [4]\n  on: [1]", "line 8",
     "YAML reads on as bool, not a string (quote it: 'on')"),
    ("M: 64,", "1: 64,", "line 2", "mapping keys must be strings"),
    ("GROUP_M: [4]", "GROUP_M: [4, 1180591620717411303424]", "line 7",
     "does not fit in 64 bits"),
    ("GROUP_M: [4]", "GROUP_M: [" + "4" * 5000 + "]", "line 7", "does not fit in 64 bits"),
    ("GROUP_M: [4]", "GROUP_M: [!!int abc]", "line 7", "cannot read 'abc' as int"),
    ("GROUP_M: [4]", "GROUP_M: " + "[" * 2000 + "]" * 2000, "line 7",
     "nested more than 64 levels deep"),
    ("kernel: matmul", "kernel: .mod:KERNEL", "kernel", "module path of Python identifiers"),
    ("GROUP_M: [4]", "GROUP_M: [4]\n  ℌ: [1]", "space.ℌ", "Python reads this name as 'H'"),
    ("GROUP_M: [4]", "GROUP_M: [4]\n  lambda: [1]", "space.lambda", "Python keyword"),
    ('["BLOCK_M <= 64"]', '["BLOCK_M + \'x\' > 1"]', "constraints[0]",
     "+ needs numbers, got a number and a string"),
    ('["BLOCK_M <= 64"]', '["\'x\' < BLOCK_M"]', "constraints[0]",
     "< needs two numbers or two strings, got a string and a number"),
    ("M: 64,", "M: 2024-01-01,", "problem.M",
     "expected a string, an integer, a finite number or a boolean"),
    # fixed: keyword arguments that are not tuned
    ("kernel: matmul", "kernel: matmul\nfixed: [1]", "fixed", "expected a mapping"),
    ("kernel: matmul", "kernel: matmul\nfixed: {GROUP_M: 8}", "fixed.GROUP_M",
     "also in space; a parameter is either tuned or fixed"),
    ("kernel: matmul", "kernel: matmul\nfixed: {num_stages: 2}", "fixed.num_stages",
     "num_stages is a launch option; give it in space (as a one-value list: num_stages: [2])"),
    ("kernel: matmul", "kernel: matmul\nfixed: {ACTIVATION: relu}", "fixed.ACTIVATION",
     "not a parameter of kernel matmul (expected one of BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)"),
    ("kernel: matmul", "kernel: matmul\nfixed: {stride_am: 1}", "fixed.stride_am",
     "kernel matmul gets it from launch_args, by position"),
    ("kernel: matmul", "kernel: matmul\nfixed: {EPS: [1]}", "fixed.EPS",
     "expected a string, an integer, a finite number or a boolean, got [1]"),
    ("kernel: matmul", "kernel: matmul\nfixed: {EPS: .nan}", "fixed.EPS",
     "expected a string, an integer, a finite number or a boolean, got nan"),
    ("kernel: matmul", "kernel: matmul\nfixed: {EPS: null}", "fixed.EPS",
     "expected a string, an integer, a finite number or a boolean, got None"),
    ("kernel: matmul", "kernel: matmul\nfixed: {'2x': 1}", "fixed.2x",
     "expected the name of a keyword argument of the kernel"),
    ('["BLOCK_M <= 64"]', '["BLOCK_M <= MODE"]\nfixed: {MODE: fast}', "constraints[0]",
     "<= needs two numbers or two strings, got a number and a string"),
]


@pytest.mark.parametrize(("old", "new", "key", "says"), CASES,
                         ids=[f"{c[2]}:{c[3]}" for c in CASES])
def test_bad_spec_is_one_line_naming_file_and_key(tmp_path, capsys, old, new, key, says):
    assert old in GOOD
    spec = tmp_path / "bad.yaml"
    spec.write_text(GOOD.replace(old, new, 1))
    out = tmp_path / "out"
    assert sweep_cli("run", spec, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"{spec}: {key}" in err and says in err, err
    assert not out.exists()


# Specs the loader once accepted: each is now refused by load_spec (checked first, so
# that a regression fails fast instead of starting a sweep) and by the CLI.
REFUSED_AT_LOAD = [
    ("M: 64,", "M: 36893488147419103232,", "line 2", "does not fit in 64 bits"),
    ("run: {backend: interpret}", "run: {backend: interpret, seed: 18446744073709551616}",
     "line 10", "does not fit in 64 bits"),
    ("GROUP_M: [4]", "GROUP_M: &g [4]\n  num_stages: *g", "line 8",
     "YAML aliases are not supported in a spec"),
    ("GROUP_M: [4]", 'GROUP_M: ["\\ud800"]', "line 7", "lone surrogate"),
    ("kernel: matmul", 'name: "a\\0b"\nkernel: matmul', "name", "'\\x00' cannot be part"),
    ("kernel: matmul", "name: ../../elsewhere\nkernel: matmul", "name", "'/' cannot be part"),
    ("kernel: matmul", "name: '..'\nkernel: matmul", "name",
     "expected a name for the run directory"),
    ("kernel: matmul", f"name: {'n' * 101}\nkernel: matmul", "name", "at most 100 characters"),
    ('["BLOCK_M <= 64"]', '["BLOCK_ᴹ <= 64"]', "constraints[0]",
     "'BLOCK_ᴹ' is read by Python as 'BLOCK_M'"),
    ('["BLOCK_M <= 64"]', '["' + "-" * 200 + 'BLOCK_M < 1"]', "constraints[0]",
     "nests deeper than 100 levels"),
    ('["BLOCK_M <= 64"]', '["' + " + ".join(["BLOCK_M"] * 130) + ' > 1"]', "constraints[0]",
     "characters long; at most 1,000"),
    ('["BLOCK_M <= 64"]', '["BLOCK_M < 1' + "0" * 400 + '"]', "constraints[0]",
     "is too large"),
]


def assert_refused(spec: Path, capsys: pytest.CaptureFixture[str], key: str, says: str) -> None:
    """load_spec refuses spec with one line naming it and key; so does `sweep run`, with
    exit 2 and nothing written."""
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{spec}: {key}") and says in message, \
        message
    out = spec.parent / "out"
    assert sweep_cli("run", spec, "--out", out) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not out.exists()


@pytest.mark.parametrize(("old", "new", "key", "says"), REFUSED_AT_LOAD,
                         ids=[f"{c[2]}:{c[3][:40]}" for c in REFUSED_AT_LOAD])
def test_spec_the_loader_once_accepted_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, key: str,
        says: str) -> None:
    assert old in GOOD
    spec = tmp_path / "bad.yaml"
    spec.write_text(GOOD.replace(old, new, 1))
    assert_refused(spec, capsys, key, says)


@pytest.mark.parametrize("value", ["2024-01-01", "[1, 2]", "{a: 1}", "null", ".inf",
                                   "!!binary aGk="])
def test_problem_values_must_be_json_scalars_even_when_no_kernel_checks_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    spec = tmp_path / "sim.yaml"
    spec.write_text("kernel: matmul\nspace: {A: [1]}\nrun: {backend: simulate}\n"
                    f"problem: {{x: {value}}}\n")
    assert_refused(spec, capsys, "problem.x",
                   "expected a string, an integer, a finite number or a boolean")


def test_the_good_spec_those_cases_start_from_is_accepted(tmp_path):
    spec = tmp_path / "good.yaml"
    spec.write_text(GOOD)
    assert len(load_spec(spec).expand()) == 2


def test_bad_spec_through_the_installed_command_has_no_traceback(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(GOOD.replace("GROUP_M: [4]", "GROUP_M: 4"))
    result = sweep_proc("run", spec, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {spec}: space.GROUP_M: expected a list of values "
                                     "(write [4]), got 4")
    assert "Traceback" not in result.stderr + result.stdout


def test_run_into_a_directory_holding_a_run_refuses_and_names_resume(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    (out / "trials.parquet").write_bytes(b"precious")
    assert sweep_cli("run", ROOT / "configs" / "quickstart.yaml", "--out", out) == 2
    assert f"sweep resume {out}" in capsys.readouterr().err
    assert (out / "trials.parquet").read_bytes() == b"precious"
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "trials.parquet"]


def test_missing_spec_file_is_bad_input(tmp_path, capsys):
    assert sweep_cli("run", tmp_path / "nope.yaml") == 2
    assert "cannot read" in capsys.readouterr().err


def test_resume_of_a_directory_that_is_not_a_run_is_bad_input(tmp_path, capsys):
    assert sweep_cli("resume", tmp_path) == 2
    assert "not a sweep run directory" in capsys.readouterr().err
    assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.slow  # a kernel whose import takes seconds, in a process of its own
def test_a_mistake_only_the_kernel_can_find_is_reported_once_its_slow_import_ends(
        tmp_path):
    # A package whose import takes seconds (Liger-Kernel's pulls in torch._dynamo): the
    # user is told what the wait is, and the mistake comes as soon as the import ends,
    # without waiting on the cluster it was joining.
    (tmp_path / "slow_kernel.py").write_text(
        "import time\n"
        "time.sleep(4)  # a package that takes seconds to import\n"
        "from sweep_kernels.softmax import KERNEL  # noqa: E402,F401\n")
    (tmp_path / "spec.yaml").write_text(
        "kernel: slow_kernel:KERNEL\n"
        "problem: {rows: 4, cols: 64, dtype: float32}\n"
        "space: {BLOCK_SIZ: [32], ROWS_PER_PROGRAM: [1]}\n"
        "run: {backend: interpret}\n")
    done = sweep_proc("run", "spec.yaml", "--runtime", "local", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "importing slow_kernel (the spec's kernel) to check the spec against it"
    assert len(lines) == 2 and "space.BLOCK_SIZ" in lines[1] and "Traceback" not in lines[1]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
