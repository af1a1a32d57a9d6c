import itertools
from pathlib import Path

from conftest import write_spec

from sweep.constraints import parse_constraint
from sweep.space import expand
from sweep.spec import load_spec


def test_expansion_follows_product_order_and_numbers_survivors_densely():
    space = {"M": [64, 128, 256], "K": [16, 32], "w": [4, 8]}
    keep = [parse_constraint("M * K <= 4096", set(space))]
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
    expanded = expand(space, [parse_constraint("p0 + p1 < 10", set(space))])
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
