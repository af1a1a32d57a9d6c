import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import write_spec

from storage.records import canonical_json
from sweep.spec import load_spec
from sweep.spec.constraints import parse_constraint
from sweep.spec.space import SpaceTooLarge, expand, parameter_kinds


def test_expansion_follows_product_order_and_numbers_survivors_densely():
    space = {"M": [64, 128, 256], "K": [16, 32], "w": [4, 8]}
    keep = [parse_constraint("M * K <= 4096", parameter_kinds(space))]
    expanded = expand(space, keep)
    expected = [dict(zip(space, values)) for values in itertools.product(*space.values())
                if values[0] * values[1] <= 4096]
    assert [expanded.config(i) for i in range(len(expanded))] == expected
    assert expanded.size_before_constraints == 12
    assert len(expanded) == 10


def test_config_values_keep_their_python_types():
    expanded = expand({"b": [True, False], "f": [0.5, 1], "s": ["a"]}, [])
    first = expanded.config(0)
    assert first == {"b": True, "f": 0.5, "s": "a"}
    assert [type(v) for v in first.values()] == [bool, float, str]
    assert expanded.config(3)["f"] == 1.0 and isinstance(expanded.config(3)["f"], float)


def test_million_point_space_expands_and_indexes_consistently():
    space = {f"p{i}": list(range(10)) for i in range(6)}
    expanded = expand(space, [parse_constraint("p0 + p1 < 10", parameter_kinds(space))])
    assert len(expanded) == 55 * 10**4
    # index -> config agrees with the product order at both ends and in the middle
    survivors = (v for v in itertools.product(range(10), repeat=6) if v[0] + v[1] < 10)
    first = next(survivors)
    assert tuple(expanded.config(0).values()) == first
    assert tuple(expanded.config(len(expanded) - 1).values()) == (9, 0, 9, 9, 9, 9)


def _spec(tmp_path: Path, name: str = "s.yaml", **changes) -> Path:
    doc = {"kernel": "matmul", "problem": {"M": 64, "N": 64, "K": 64, "dtype": "float16"},
           "space": {"BLOCK_M": [32], "BLOCK_N": [32], "BLOCK_K": [32], "GROUP_M": [4]},
           "run": {"backend": "interpret", "trial_timeout_s": 10}}
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            doc[section] = {**doc[section], field: value}
        else:
            doc[section] = value
    return write_spec(tmp_path / name, **doc)


def test_fingerprint_covers_what_decides_results_and_not_operational_settings(tmp_path):
    base = load_spec(_spec(tmp_path)).fingerprint
    assert load_spec(_spec(tmp_path, run__trial_timeout_s=99)).fingerprint == base
    assert load_spec(_spec(tmp_path, run__max_retries=3)).fingerprint == base
    assert load_spec(_spec(tmp_path, problem__M=128)).fingerprint != base
    assert load_spec(_spec(tmp_path, space__BLOCK_M=[32, 64])).fingerprint != base
    assert load_spec(_spec(tmp_path, timing={"rep_ms": 5})).fingerprint != base


def test_fingerprint_changes_when_the_kernel_source_changes(tmp_path, monkeypatch):
    import sys

    module = tmp_path / "mykernel.py"
    module.write_text("from sweep_kernels.matmul import KERNEL\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_path = _spec(tmp_path, kernel="mykernel:KERNEL")
    before = load_spec(spec_path).fingerprint
    sys.modules.pop("mykernel")
    module.write_text("from sweep_kernels.matmul import KERNEL\n# tuned differently now\n")
    after = load_spec(spec_path).fingerprint
    sys.modules.pop("mykernel")
    assert before != after


def test_configs_are_screened_quickly_only_when_finalists_are_retimed(tmp_path):
    from sweep.spec import load_spec

    def timing(extra: str):
        path = tmp_path / "s.yaml"
        path.write_text("kernel: matmul\nspace: {A: [1]}\nrun: {backend: simulate"
                        + extra.partition("|")[0] + "}\n" + extra.partition("|")[2])
        spec = load_spec(path)
        return spec.timing.per_config(spec.run.finalists), spec.fingerprint

    default, fp_default = timing("|timing: {warmup_ms: 25, rep_ms: 100}")
    assert default == (5.0, 20.0)
    assert timing("|timing: {screen: {warmup_ms: 1, rep_ms: 10}}")[0] == (1, 10)
    off, fp_off = timing("|timing: {warmup_ms: 25, rep_ms: 100, screen: off}")
    assert off == (25, 100) and fp_off != fp_default  # rows mean other timings: no resume
    assert timing(", finalists: 0|timing: {warmup_ms: 25, rep_ms: 100}")[0] == (25, 100)


MIXED_SPACE = {
    "n": [1, -7, 2**63 - 1, -(2**63)],
    "f": [0.1, 1, 1e-7, 1e22, -0.0],
    "b": [True, False],
    "s": ['say "hi"', "é\\n\u2028", "\U0001f600", "tab\there"],
}


def _product_reference(space: dict, keep: Callable[[dict], bool]) -> list[dict]:
    """The survivors, the slow way: itertools.product and a Python predicate."""
    kinds = {k: type(v[0]) if len({type(x) for x in v}) == 1 else float for k, v in space.items()}
    configs = [{k: kinds[k](v) for k, v in zip(space, values)}
               for values in itertools.product(*space.values())]
    return [c for c in configs if keep(c)]


@pytest.mark.parametrize("chunk_points", [1, 7, 64, 159, 160, 10**6])
def test_chunked_expansion_equals_the_product_order_at_any_chunk_size(chunk_points: int) -> None:
    constraints = [parse_constraint("n > 0 or b", parameter_kinds(MIXED_SPACE)),
                   parse_constraint("s != 'tab\\there' and f < 1e20",
                                    parameter_kinds(MIXED_SPACE))]
    expanded = expand(MIXED_SPACE, constraints, chunk_points=chunk_points)
    expected = _product_reference(
        MIXED_SPACE, lambda c: (c["n"] > 0 or c["b"]) and c["s"] != "tab\there" and c["f"] < 1e20)
    assert [expanded.config(i) for i in range(len(expanded))] == expected
    assert expanded.size_before_constraints == 160
    for name in MIXED_SPACE:
        assert expanded.columns[name].tolist() == [c[name] for c in expected]


def test_expansion_stops_keeping_configs_past_the_cap_and_reports_both_counts() -> None:
    space = {"a": list(range(100)), "b": list(range(100))}
    with pytest.raises(SpaceTooLarge) as e:
        expand(space, [parse_constraint("a >= b", parameter_kinds(space))], chunk_points=333,
               max_configs=5000)
    assert (e.value.configs, e.value.points) == (5050, 10_000)
    assert len(expand(space, [], max_configs=10_000)) == 10_000


def test_config_json_column_equals_canonical_json_of_each_config() -> None:
    expanded = expand(MIXED_SPACE, [parse_constraint("n != 1", parameter_kinds(MIXED_SPACE))])
    indices = np.r_[np.arange(len(expanded)), [5, 0, 5]][::-1]
    column = expanded.config_json_column(indices)
    assert column.type == pa.string()
    assert column.to_pylist() == [canonical_json(expanded.config(i)) for i in indices]
    assert expanded.config_json_column(np.array([], dtype=np.int64)).to_pylist() == []
    few = indices[::7][:5]  # fewer rows than a group's combinations: only theirs encoded
    assert expanded.config_json_column(few).to_pylist() == \
        [canonical_json(expanded.config(i)) for i in few]


def test_config_json_column_groups_parameters_with_many_values_correctly() -> None:
    # More combinations than one group of JSON texts holds: several groups, joined by arrow.
    space = {"z": list(range(300)), "a": [f"v{i}" for i in range(70)], "m": [0.5, 1.5]}
    expanded = expand(space, [])
    for step in (37, 4001):  # many rows (every text of a group), and a few (only theirs)
        indices = np.arange(0, len(expanded), step)
        assert expanded.config_json_column(indices).to_pylist() == \
            [expanded.config_json(i) for i in indices]


def test_config_json_column_of_a_million_configs_is_fast() -> None:
    space = {f"p{i}": list(range(10)) for i in range(6)}
    space["s"] = ['a"b', "é", "x"]
    expanded = expand(space, [parse_constraint("p0 + p1 < 16", parameter_kinds(space))])
    indices = np.random.default_rng(0).permutation(len(expanded))[:1_000_000]
    # Processor time, not wall-clock: a busy machine stretches the one, not the other.
    t0 = time.process_time()
    column = expanded.config_json_column(indices)
    elapsed = time.process_time() - t0
    print(f"config_json_column: {len(column):,} configs in {elapsed:.3f} s of CPU")
    assert len(column) == 1_000_000 and elapsed < 3.0
    sample = range(0, 1_000_000, 997)
    assert [column[i].as_py() for i in sample] == [expanded.config_json(indices[i])
                                                   for i in sample]


GOLDEN = """\
kernel: matmul
problem: {M: 64, dtype: float16, scale: 0.5, fast: true}
space: {A: [1, 2, 3], S: [x, "é"], F: [0.5, 1]}
constraints: ["A * F > 0.5"]
timing: {warmup_ms: 3, rep_ms: 7}
run: {backend: simulate, seed: 11}
simulate: {fail_rate: 0.25, seed: 5}
"""


def test_fingerprint_of_a_spec_is_what_it_always_was(tmp_path: Path) -> None:
    """Changing `fingerprint` would make every existing run refuse to resume."""
    path = tmp_path / "golden.yaml"
    path.write_text(GOLDEN)
    assert load_spec(path).fingerprint == "08e85e3b098bb846"


def test_declared_fingerprint_is_the_same_with_or_without_importing_the_kernel(
        tmp_path: Path) -> None:
    path = _spec(tmp_path, problem={"M": 128})
    imported = load_spec(path)
    unimported = load_spec(path, import_kernel=False)
    assert imported.declared_fingerprint == unimported.declared_fingerprint
    assert len(imported.declared_fingerprint) == 16
    int(imported.declared_fingerprint, 16)
    assert imported.problem_as_written == unimported.problem_as_written == {"M": 128}
    assert imported.problem == {"M": 128, "N": 1024, "K": 1024, "dtype": "float16"}
    assert unimported.problem == {"M": 128} and unimported.kernel_source == ""
    assert imported.fingerprint != unimported.fingerprint  # kernel source and defaults


@pytest.mark.parametrize("change", [
    {"kernel": "softmax"}, {"problem": {"M": 64, "N": 64, "K": 64}},
    {"problem": {"M": 64, "N": 64, "K": 64, "dtype": "float32"}},
    {"space__BLOCK_M": [32, 64]}, {"constraints": ["BLOCK_M >= 16"]},
    {"timing": {"rep_ms": 5}}, {"timing": {"screen": "off"}}, {"validation": "off"},
    {"validation": {"rtol": 0.5}}, {"run__backend": "cuda"}, {"run__seed": 1},
])
def test_declared_fingerprint_changes_with_every_identity_key(tmp_path: Path,
                                                              change: dict) -> None:
    base = load_spec(_spec(tmp_path), import_kernel=False).declared_fingerprint
    changed = load_spec(_spec(tmp_path, "changed.yaml", **change), import_kernel=False)
    assert changed.declared_fingerprint != base


@pytest.mark.parametrize(("change", "same"), [
    ({"simulate__trial_ms": 2}, False), ({"simulate__fail_rate": 0.5}, False),
    ({"simulate__seed": 3}, False), ({"simulate__workers": 9}, True),
    ({"run__workers": 3}, True), ({"run__trial_timeout_s": 99}, True),
])
def test_declared_fingerprint_of_a_simulated_run_covers_simulate_options_but_workers(
        tmp_path: Path, change: dict, same: bool) -> None:
    sim = {"run": {"backend": "simulate"}, "simulate": {"workers": 2, "trial_ms": 1}}
    base = load_spec(_spec(tmp_path, **sim), import_kernel=False).declared_fingerprint
    changed = load_spec(_spec(tmp_path, "changed.yaml", **sim, **change), import_kernel=False)
    assert (changed.declared_fingerprint == base) is same


def test_load_spec_without_import_kernel_runs_no_code_the_spec_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "recording_kernel.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nfrom sweep_kernels.matmul import KERNEL\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "recording_kernel", raising=False)
    path = _spec(tmp_path, kernel="recording_kernel:KERNEL")
    declared = load_spec(path, import_kernel=False)
    assert not marker.exists() and "recording_kernel" not in sys.modules
    assert declared.kernel_source == ""
    loaded = load_spec(path)
    assert marker.exists()
    assert loaded.declared_fingerprint == declared.declared_fingerprint
    monkeypatch.delitem(sys.modules, "recording_kernel")


def test_spec_normalised_after_a_backend_override_keeps_both_fingerprints(
        tmp_path: Path) -> None:
    """The run directory stores as_yaml(); a resume recomputes both fingerprints from it."""
    original = load_spec(_spec(tmp_path, problem={"M": 128}, run={"backend": "simulate"}),
                         backend="interpret")
    stored = tmp_path / "stored.yaml"
    stored.write_text(original.as_yaml())
    for import_kernel in (True, False):
        assert load_spec(stored, import_kernel=import_kernel).declared_fingerprint == \
            original.declared_fingerprint
    assert load_spec(stored).fingerprint == original.fingerprint
