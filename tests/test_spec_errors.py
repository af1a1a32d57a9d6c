"""Every spec mistake: exit 2, one line naming the file and the key, no traceback, nothing
written, and all of it before Ray starts."""

from pathlib import Path

import pytest
from conftest import ROOT, sweep_cli, sweep_proc

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
    ("  GROUP_M: [4]\n", "", "space", "needs a value list for GROUP_M"),
    ('["BLOCK_M <= 64"]', '["BLOCK_M <= "]', "constraints[0]", "does not parse"),
    ('["BLOCK_M <= 64"]', '["BLOCK_X <= 64"]', "constraints[0]", "unknown parameter"),
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
    ("run: {backend: interpret}", "run: {backend: interpret}\ntiming: {screen: {rep: 5}}",
     "timing.screen.rep", "unknown key"),
    ("run: {backend: interpret}", "run: {backend: interpret}\ntiming: {screen: {rep_ms: 0}}",
     "timing.screen.rep_ms", "number > 0"),
    ("run: {backend: interpret}", "run: {backend: interpret}\ntiming: {screen: fast}",
     "timing.screen", "expected a mapping"),
    ("run: {backend: interpret}", "run: {backend: interpret, start_timeout_s: 0}",
     "run.start_timeout_s", "number > 0"),
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


def test_the_good_spec_those_cases_start_from_is_accepted(tmp_path):
    from sweep.spec import load_spec

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
