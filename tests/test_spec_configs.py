"""`configs:`, an explicit list of configs as triton.autotune takes them, beside `space:`'s
product, top-level or a problem's own; configs that leave a parameter unset launch without
it and hold null in the trial table. Real sweeps on the simulate backend."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import sweep_in, sweep_proc, write_spec

from sweep.search.scheduling import compile_order
from sweep.search.strategies import Guided
from sweep.search.warm_start import indices_of
from sweep.spec import SpecError, load_spec
from sweep.spec.search_options import SearchOptions
from sweep.spec.space import concatenate, expand, expand_configs

SIM = dict(name="cfg", kernel="matmul", run={"backend": "simulate", "snapshot_every_s": 0.5},
           simulate={"workers": 2, "trial_ms": 1})
CONFIGS = [{"BLOCK": 64, "num_warps": 4}, {"BLOCK": 128, "num_warps": 4, "maxnreg": 128},
           {"BLOCK": 32, "num_warps": 8}, {"BLOCK": 256, "num_warps": 8}]
# Two kernels' problems, of different parameters: a configs list and a product.
TWO = dict(SIM, problems=[
    {"kernel": "pkg.a:add", "key": "N=1024; float32", "configs": CONFIGS},
    {"kernel": "pkg.b:gather", "key": "N=64; float32",
     "space": {"TILE": [16, 32], "num_warps": [2, 4]}}])


def test_a_configs_list_expands_in_the_order_written_less_what_constraints_refuse(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", **SIM, configs=CONFIGS,
                                constraints=["BLOCK >= 64"]))
    space = spec.expand()
    assert [space.kernel_config(i) for i in range(len(space))] == [
        CONFIGS[0], CONFIGS[1], CONFIGS[3]]
    assert space.size_before_constraints == 4
    # what constraints and fixed: are checked against: each parameter's values
    assert dict(spec.space) == {"BLOCK": [64, 128, 32, 256], "num_warps": [4, 8],
                                "maxnreg": [128]}


def test_a_constraint_on_a_parameter_a_config_leaves_unset_does_not_refuse_it(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", **SIM, configs=CONFIGS,
                                constraints=["maxnreg > 200"]))
    space = spec.expand()
    assert [space.kernel_config(i) for i in range(len(space))] == [
        CONFIGS[0], CONFIGS[2], CONFIGS[3]]
    assert "maxnreg" not in space.names  # no config left sets it


def test_configs_that_leave_a_parameter_unset_leave_it_out_and_null_in_the_table():
    space = expand_configs(CONFIGS, ())
    assert space.config(0) == {"BLOCK": 64, "num_warps": 4}
    assert space.configs([1, 0]) == [CONFIGS[1], CONFIGS[0]]
    assert json.loads(space.config_json(2)) == CONFIGS[2]
    assert space.config_json_column(np.arange(4)).to_pylist() == [
        space.config_json(i) for i in range(4)]
    columns = space.arrow_columns(np.arange(4))
    assert columns["maxnreg"].to_pylist() == [None, 128, None, None]
    assert columns["BLOCK"].type == pa.int64() and columns["BLOCK"].null_count == 0
    codes, size = space.levels("maxnreg")
    assert size == 2 and codes.tolist() == [1, 0, 1, 1]  # unset: a code of its own


def test_problems_of_different_parameters_join_with_each_ones_own_parameters():
    a = expand_configs([{"BLOCK": 64}, {"BLOCK": 128, "maxnreg": 64}], ())
    b = expand({"TILE": [16, 32], "BLOCK": [0.5]}, ())
    space = concatenate([a, b], ["key"], [["a"], ["b"]])
    assert space.names == ("key", "BLOCK", "maxnreg", "TILE")
    assert space.kinds["BLOCK"] is float  # int and float values: one float column
    assert [space.kernel_config(i) for i in range(4)] == [
        {"BLOCK": 64.0}, {"BLOCK": 128.0, "maxnreg": 64},
        {"BLOCK": 0.5, "TILE": 16}, {"BLOCK": 0.5, "TILE": 32}]
    assert space.arrow_columns(np.arange(4))["TILE"].to_pylist() == [None, None, 16, 32]
    second = space.part(1)
    assert second.names == ("BLOCK", "TILE") and second.present == {}
    assert [second.kernel_config(i) for i in range(2)] == [
        space.kernel_config(2), space.kernel_config(3)]
    first = space.part(0)
    assert first.names == ("BLOCK", "maxnreg")
    assert [first.kernel_config(i) for i in range(2)] == [{"BLOCK": 64.0},
                                                          {"BLOCK": 128.0, "maxnreg": 64}]
    mixed = concatenate([expand({"X": [1]}, ()), expand({"X": ["x"]}, ())], ["key"],
                        [["a"], ["b"]])
    assert mixed.kinds["X"] is str and mixed.tables["X"].tolist() == ["1", "x"]


def test_the_search_tells_a_parameter_left_unset_from_any_value_of_it():
    space = expand_configs([{"A": 1, "R": 64}, {"A": 1}, {"A": 2}, {"A": 2, "R": 64}], ())
    # a config leaving R unset is found as itself, not as the first with A=1
    assert indices_of(space, [{"A": 1}, {"A": 2, "R": 64}, {"A": 2}]) == [1, 3, 2]
    # the configs of a list are in no product order: a neighbour (one step in A, or R set
    # or unset) is still found
    listed = expand_configs([{"A": 2, "R": 64}, {"A": 1}, {"A": 2}, {"A": 1, "R": 64},
                             {"A": 3}], ())
    guided = Guided(listed, SearchOptions(strategy="guided"), batch=2)
    assert [sorted(guided._neighbours(i)) for i in range(5)] == [
        [2, 3], [2, 3, 4], [0, 1], [0, 1], [1]]
    # a config of every problem goes out together: unset is not the first value
    alike = expand_configs([{"A": 1, "R": 1}, {"A": 1}], ())  # one compile weight
    both = concatenate([alike, alike], ["p"], [[1], [2]])
    order = compile_order(both, range(4))
    assert sorted([sorted(order[:2]), sorted(order[2:])]) == [[0, 2], [1, 3]]


def test_every_problem_with_its_own_space_needs_no_top_level_one(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", **TWO))
    assert spec.problem_keys == ("kernel", "key")
    assert [dict(p) for p in spec.problems] == [
        {"kernel": "pkg.a:add", "key": "N=1024; float32"},
        {"kernel": "pkg.b:gather", "key": "N=64; float32"}]
    space = spec.expand()
    assert space.starts == (0, 4) and len(space) == 8
    assert [space.kernel_config(i) for i in range(4)] == CONFIGS
    assert space.kernel_config(4) == {"TILE": 16, "num_warps": 2}


def test_per_problem_constraints_read_that_problems_own_parameters(tmp_path):
    path = write_spec(tmp_path / "s.yaml", **TWO, constraints=["BLOCK >= 64"])
    with pytest.raises(SpecError, match=r"unknown name 'BLOCK'.* \(with problems\[1\]\)"):
        load_spec(path)
    one = dict(TWO, problems=[TWO["problems"][0], {**TWO["problems"][1], "configs": [
        {"BLOCK": 16}, {"BLOCK": 64}]}])
    del one["problems"][1]["space"]
    space = load_spec(write_spec(tmp_path / "t.yaml", **one,
                                 constraints=["BLOCK >= 64"])).expand()
    assert space.sizes == (3, 1) and space.kernel_config(3) == {"BLOCK": 64}


def test_a_problem_without_its_own_space_tunes_the_specs(tmp_path):
    doc = dict(SIM, configs=CONFIGS[:2], problems=[
        {"key": "a"}, {"key": "b", "space": {"TILE": [1, 2]}}])
    space = load_spec(write_spec(tmp_path / "s.yaml", **doc)).expand()
    assert [space.config(i) for i in range(len(space))] == [
        {"key": "a", **CONFIGS[0]}, {"key": "a", **CONFIGS[1]},
        {"key": "b", "TILE": 1}, {"key": "b", "TILE": 2}]


def test_configs_change_the_fingerprint_and_specs_without_them_keep_theirs(tmp_path):
    plain = load_spec(write_spec(tmp_path / "p.yaml", **SIM, space={"BLOCK": [64, 128]}))
    assert "configs" not in plain.identity() and "problem_spaces" not in plain.identity()
    listed = load_spec(write_spec(tmp_path / "c.yaml", **SIM, configs=CONFIGS))
    other = load_spec(write_spec(tmp_path / "d.yaml", **SIM, configs=CONFIGS[::-1]))
    assert listed.fingerprint != other.fingerprint  # the order is the index order
    assert listed.declared_fingerprint != other.declared_fingerprint
    own = load_spec(write_spec(tmp_path / "o.yaml", **TWO))
    assert own.identity()["problem_spaces"][1] == {"space": TWO["problems"][1]["space"]}


@pytest.mark.parametrize("doc", [dict(SIM, configs=CONFIGS), TWO])
def test_a_normalised_configs_spec_keeps_both_fingerprints(tmp_path, doc):
    path = write_spec(tmp_path / "s.yaml", **doc)
    spec = load_spec(path, backend="simulate")  # an override: as_yaml dumps
    assert spec.overridden
    again = tmp_path / "again.yaml"
    again.write_text(spec.as_yaml())
    reloaded = load_spec(again)
    assert reloaded.fingerprint == spec.fingerprint
    assert reloaded.declared_fingerprint == spec.declared_fingerprint


BAD = [
    (dict(SIM, configs=CONFIGS, space={"A": [1]}),
     "configs: give space: (value lists, tuned as their product) or configs: (an explicit "
     "list of configs), not both"),
    (dict(SIM, configs={"BLOCK": 64}),
     "configs: expected a non-empty list of configs (each a mapping of parameter to value), "
     "got {'BLOCK': 64}"),
    (dict(SIM, configs=[]),
     "configs: expected a non-empty list of configs (each a mapping of parameter to value), "
     "got []"),
    (dict(SIM, configs=[{"BLOCK": 64}, 128]),
     "configs[1]: expected a mapping of parameter to value (e.g. {BLOCK: 64, num_warps: 4}), "
     "got 128"),
    (dict(SIM, configs=[{"BLOCK": 64}, {"BLOCK": [128]}]),
     "configs[1].BLOCK: expected a number, a string or a boolean, got [128]"),
    (dict(SIM, configs=[{"BLOCK": 64}, {"BLOCK": None}]),
     "configs[1].BLOCK: expected a number, a string or a boolean, got None"),
    (dict(SIM, configs=[{"BLOCK": 64}, {"BLOCK": "64"}]),
     "configs[1].BLOCK: expected int as configs[0].BLOCK is, got '64'; a parameter's values "
     "share one type"),
    (dict(SIM, configs=[{"BLOCK": 64, "num_warps": 4}, {"BLOCK": 32},
                        {"num_warps": 4, "BLOCK": 64.0}]),
     "configs[2]: the same config as configs[0]"),
    (dict(SIM, configs=[{"1x": 64}]), "configs[0].1x: a parameter name must be a Python "
                                      "identifier"),
    (dict(SIM, problems=[{"key": "a"}]),
     "space: required key is missing (or configs:, or a space: or configs: in every problem)"),
    (dict(TWO, space={"A": [1]}),
     "space: no problem tunes it: every problem has a space: or configs: of its own; drop it"),
    (dict(SIM, problems=[{"key": "a", "configs": [{"A": 1}], "space": {"A": [1]}}]),
     "problems[0].configs: give space: (value lists, tuned as their product) or configs: (an "
     "explicit list of configs), not both"),
    (dict(SIM, problems=[{"key": "a", "configs": [{"A": 1}, {"A": 1}]}]),
     "problems[0].configs[1]: the same config as problems[0].configs[0]"),
    (dict(SIM, problems=[{"key": "a", "space": {"A": 1}}]),
     "problems[0].space.A: expected a list of values (write [1]), got 1"),
    (dict(SIM, problems=[{"A": 2, "configs": [{"A": 1}]}]),
     "problems[0].A: also set under space:; a problem key cannot be tuned or fixed"),
]


@pytest.mark.parametrize(("doc", "says"), BAD)
def test_a_bad_configs_list_exits_2_with_one_line_and_writes_nothing(tmp_path, doc, says):
    spec = write_spec(tmp_path / "s.yaml", **doc)
    result = sweep_in("run", spec, "--out", tmp_path / "run", "--runtime", "local")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {spec}: {says}"], result.stderr
    assert not (tmp_path / "run").exists()


def test_sweep_run_refuses_both_space_and_configs_in_one_line_from_the_command_line(
        tmp_path):
    spec = write_spec(tmp_path / "s.yaml", **BAD[0][0])
    result = sweep_proc("run", spec, "--out", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {spec}: {BAD[0][1]}"]
    assert not (tmp_path / "run").exists()


def test_a_sweep_over_problems_of_different_parameters_writes_nulls_and_resumes(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", **TWO)
    out = tmp_path / "run"
    first = sweep_in("run", spec, "--out", out, "--runtime", "local", "--max-trials", "3")
    assert first.returncode == 0, first.stderr
    done = sweep_in("resume", out)
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out / "trials.parquet")
    assert table.column_names[:7] == ["index", "kernel", "key", "BLOCK", "num_warps",
                                      "maxnreg", "TILE"]
    rows = table.to_pylist()
    assert [r["index"] for r in rows] == list(range(8))
    assert {r["status"] for r in rows} == {"ok"}
    assert [r["kernel"] for r in rows] == ["pkg.a:add"] * 4 + ["pkg.b:gather"] * 4
    assert [r["BLOCK"] for r in rows] == [64, 128, 32, 256, None, None, None, None]
    assert [r["maxnreg"] for r in rows] == [None, 128, None, None, None, None, None, None]
    assert [r["TILE"] for r in rows] == [None] * 4 + [16, 16, 32, 32]
    assert [r["num_warps"] for r in rows] == [4, 4, 8, 8, 2, 4, 2, 4]
    # the record holds what the kernel is launched with: unset parameters left out
    assert [json.loads(r["config"]) for r in rows[:4]] == CONFIGS
    fingerprint = pq.read_schema(out / "trials.parquet").metadata[b"fingerprint"]
    again = sweep_in("resume", out)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    assert pq.read_table(out / "trials.parquet").to_pylist() == rows
    assert pq.read_schema(out / "trials.parquet").metadata[b"fingerprint"] == fingerprint
    best = json.loads((out / "best.json").read_text())["by_problem"]
    assert [p["problem"] for p in best] == [
        {"kernel": "pkg.a:add", "key": "N=1024; float32"},
        {"kernel": "pkg.b:gather", "key": "N=64; float32"}]
    assert best[0]["config"] in CONFIGS and set(best[1]["config"]) == {"TILE", "num_warps"}


def test_a_problems_configs_are_checked_against_the_kernels_parameters(tmp_path):
    doc = dict(SIM, run={"backend": "interpret"}, problem={"M": 16, "N": 16, "K": 16},
               problems=[{"dtype": "float32", "configs": [{"BLOCK_M": 16, "BLOCK_N": 16,
                                                         "BLOCK_K": 16, "GROUP_M": 1}]},
                         {"dtype": "float16", "configs": [{"BLOCK_M": 16, "TILE": 4}]}])
    with pytest.raises(SpecError, match=r"problems\[1\]\.configs\.TILE: not a parameter of "
                                        "kernel matmul"):
        load_spec(write_spec(tmp_path / "s.yaml", **doc))


def test_the_same_sweep_again_is_answered_from_the_cache_for_a_problem_of_its_own_space(
        tmp_path):
    """The cache answers kernel backends only: a real interpreter sweep, one problem of the
    spec's space and one of its own configs."""
    tile = {"BLOCK_M": 16, "BLOCK_K": 16, "GROUP_M": 1}
    doc = dict(name="own", kernel="matmul", problem={"N": 32, "K": 16, "dtype": "float32"},
               space={**{k: [v] for k, v in tile.items()}, "BLOCK_N": [16, 32]},
               problems=[{"M": 16}, {"M": 32, "configs": [  # num_warps: not the spec's
                   {**tile, "BLOCK_N": 32, "num_warps": 4},
                   {**tile, "BLOCK_N": 16, "num_warps": 4}]}],
               timing={"warmup_ms": 1, "rep_ms": 3}, run={"backend": "interpret",
                                                          "finalists": 0})
    spec = write_spec(tmp_path / "s.yaml", **doc)
    first = sweep_in("run", spec, "--out", tmp_path / "run")
    assert first.returncode == 0, first.stderr
    again = sweep_in("run", spec, "--out", tmp_path / "again")
    assert again.returncode == 0, again.stderr
    cached = [line for line in again.stdout.splitlines() if "cached —" in line]
    assert len(cached) == 2 and '"M":32' in cached[1], again.stdout
    assert not (tmp_path / "again").exists()


def test_a_capture_spec_with_each_problems_configs_and_no_space_tunes_each_list(tmp_path):
    """The spec `sweep capture` writes: a problem per captured call, its configs its
    kernel's own list (as_spec), no top-level space; tuned on the interpreter."""
    from test_captured_kernel import _call, _spec

    capture = tmp_path / "cap"
    capture.mkdir()
    calls = [_call(capture, "hand_kernels:gather2", 40, 1),
             _call(capture, "hand_kernels:gather2", 90, 2, blocks=((16, 1), (32, 2)))]
    spec = _spec(capture, calls)
    doc = json.loads(spec.read_text())
    del doc["space"]
    for problem, call in zip(doc["problems"], calls):
        problem["configs"] = [c.as_spec() for c in call.configs]
    spec.write_text(json.dumps(doc))
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [(r["key"], json.loads(r["config"])) for r in rows] == [
        (call.label, c.as_spec()) for call in calls for c in call.configs]
    assert {r["status"] for r in rows} == {"ok"}
