"""Inputs sized to exhaust the loader rather than to be wrong: each is refused with one short
line, quickly, before any Ray work and without a large allocation."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sweep_cli

import sweep.spec
from sweep.spec import MAX_SPEC_BYTES, SpecError, load_spec

SIMULATE = "kernel: matmul\nrun: {backend: simulate}\n"


def refusal(spec: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`sweep run` refuses spec: exit 2, one line, nothing written. Returns that line."""
    with pytest.raises(SpecError):  # first, so that a regression fails before Ray starts
        load_spec(spec).expand()
    out = spec.parent / "out"
    assert sweep_cli("run", spec, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {spec}: "), err
    assert not out.exists()
    return err


def test_spec_that_is_not_utf8_names_the_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(SIMULATE.encode() + "space: {A: [café]}\n".encode("latin-1"))
    assert refusal(spec, capsys) == (f"error: {spec}: not UTF-8 text (invalid continuation "
                                     "byte: byte 0xe9 on line 3); save the file as UTF-8")


def test_spec_larger_than_one_mebibyte_is_refused_without_parsing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text(SIMULATE + "space: {A: [1]}\n" + "#" * MAX_SPEC_BYTES + "\n")
    assert "larger than 1 MiB (1,048,576 bytes)" in refusal(spec, capsys)


# A few hundred bytes that expand to 9**9 (387 million) strings: gigabytes of RAM before
# aliases were refused.
BOMB = SIMULATE + "space:\n  a: &a [" + ", ".join(["lol"] * 9) + "]\n" + "".join(
    f"  {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi"))


def test_yaml_alias_bomb_is_refused_at_its_first_alias(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMB)
    t0 = time.process_time()  # processor time: a busy machine does not stretch it
    err = refusal(spec, capsys)
    assert err == f"error: {spec}: line 5: YAML aliases are not supported in a spec"
    assert time.process_time() - t0 < 5


def test_an_alias_anywhere_is_refused_with_its_line(tmp_path: Path) -> None:
    """The bomb's smaller sibling: harmless in size, but aliases are refused outright."""
    spec = tmp_path / "alias.yaml"
    spec.write_text(SIMULATE + "space: {A: &v [1, 2]}\nproblem: {n: 1}\nconstraints: *v\n")
    with pytest.raises(SpecError, match=r"line 5: YAML aliases are not supported in a spec$"):
        load_spec(spec)


@pytest.mark.parametrize("text", [
    "space: {A: [1, '" + "x" * 100_000 + "']}\n",
    "space: {A: [1]}\nconstraints: ['" + "A " * 50_000 + "']\n",
    "space: {A: [1]}\nproblem: {n: [" + "1, " * 10_000 + "]}\n",
    "space: {A: [1]}\nname: '" + "n" * 100_000 + "'\n",
    "space: {A: [1]}\ntiming: {rep_ms: '" + "9" * 100_000 + "'}\n",
    "space: {A: [1]}\ntiming:\n  ? " + "k" * 100_000 + "\n  : 1\n",
    "space:\n  ? " + "P" * 100_000 + "\n  : 1\n",
])
def test_error_lines_stay_short_whatever_the_value(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   text: str) -> None:
    spec = tmp_path / "long.yaml"
    spec.write_text(SIMULATE + text)
    assert len(refusal(spec, capsys)) < len(f"error: {spec}: ") + 300


def test_configs_left_after_constraints_are_capped_naming_space_and_both_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep.spec.model, "MAX_CONFIGS", 1000)
    spec = tmp_path / "wide.yaml"
    spec.write_text(SIMULATE + f"space: {{A: [0, 1, 2, 3], B: {list(range(500))}}}\n"
                    "constraints: ['A + B > 0']\n")
    assert refusal(spec, capsys) == (
        f"error: {spec}: space: 1,999 configs after constraints (of 2,000 points); at most "
        "1,000; add constraints or shorten the value lists")


def test_space_without_constraints_over_the_cap_is_refused_before_expanding(
        tmp_path: Path) -> None:
    spec = tmp_path / "huge.yaml"
    spec.write_text(SIMULATE + "space: {A: " + str(list(range(5000))) + ", B: "
                    + str(list(range(2000))) + "}\n")
    t0 = time.process_time()  # processor time: a busy machine does not stretch it
    with pytest.raises(SpecError, match=r"space: 10,000,000 configs after constraints \(of "
                                        r"10,000,000 points\); at most 5,000,000"):
        load_spec(spec).expand()
    assert time.process_time() - t0 < 5


EXPAND_50M = """
import resource, sys, time
from sweep.spec.constraints import parse_constraint
from sweep.spec.space import expand, parameter_kinds

# Materialising every point needs gigabytes: fail here rather than starve the host.
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
limit = 6 << 30 if hard == resource.RLIM_INFINITY else min(6 << 30, hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
space = {"a": list(range(100)), "b": list(range(100)), "c": list(range(50)),
         "d": list(range(10)), "e": [2 ** i for i in range(10)]}
t0 = time.perf_counter()
kept = expand(space, [parse_constraint("a == 3 and b < 2 and e >= 256", parameter_kinds(space))])
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(kept.size_before_constraints, len(kept), peak, f"{elapsed:.2f}")
"""


def test_fifty_million_points_with_a_selective_constraint_expand_in_little_memory() -> None:
    """Expansion walks the product in chunks: peak memory is a chunk plus the survivors
    (about 130 MB here, most of it numpy and pyarrow themselves), where materialising
    every point took 12 GB."""
    result = subprocess.run([sys.executable, "-c", EXPAND_50M], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    points, kept, peak_mb, elapsed = result.stdout.split()
    print(f"expand: {int(points):,} points -> {int(kept):,} configs in {elapsed} s, "
          f"peak RSS {peak_mb} MB")
    assert (int(points), int(kept)) == (50_000_000, 2_000)
    assert int(peak_mb) < 1536
