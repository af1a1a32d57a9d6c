"""A sweep over several problems (`problems:`): one run, one table problem-major with a
column per problem key that varies, a best, finalists and a cache entry per problem, and
stop and resume as for one problem. Real runs: the interpreter, and the simulate backend
where a signal must land while trials run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, sweep_in, sweep_proc, write_spec
from conftest import SHAPES as BASE

from storage import cache
from sweep.search.per_problem import PerProblem
from sweep.search.scheduling import compile_order
from sweep.spec import SpecError, load_spec

SHAPES = {**BASE, "timing": {"warmup_ms": 1, "rep_ms": 3},
          "run": {"backend": "interpret", "finalists": 2}}


def shapes_spec(path: Path, **changes) -> Path:
    return write_spec(path, **{**SHAPES, **changes})


def test_problems_are_merged_over_problem_and_keys_that_vary_lead_each_config(tmp_path):
    spec = load_spec(shapes_spec(tmp_path / "s.yaml"))
    assert [dict(p) for p in spec.problems] == [
        {"M": m, "N": 64, "K": 64, "dtype": "float32"} for m in (16, 32, 64)]
    assert spec.problem_keys == ("M",)
    space = spec.expand()
    # BLOCK_M <= M read against each problem: M=16 keeps half the configs
    assert space.starts == (0, 2, 6) and len(space) == 10
    assert [space.config(i)["M"] for i in range(len(space))] == [16] * 2 + [32] * 4 + [64] * 4
    assert all(space.config(i)["BLOCK_M"] <= space.config(i)["M"] for i in range(len(space)))
    # what a worker gets carries the problem; what its record holds is the kernel's config
    assert "M" in space.config(3) and "M" not in json.loads(space.config_json(3))
    assert [space.problem_of(i) for i in (0, 1, 2, 5, 6, 9)] == [0, 0, 1, 1, 2, 2]


def test_adding_a_problem_changes_the_fingerprint_and_one_problem_keeps_its_own(tmp_path):
    three = load_spec(shapes_spec(tmp_path / "a.yaml"))
    four = load_spec(shapes_spec(tmp_path / "b.yaml",
                                 problems=[*SHAPES["problems"], {"M": 128}]))
    assert three.fingerprint != four.fingerprint
    assert three.declared_fingerprint != four.declared_fingerprint
    alone = {k: v for k, v in SHAPES.items() if k not in ("problems", "constraints")}
    one = load_spec(write_spec(tmp_path / "c.yaml", **{**alone,
                                                       "problem": {"M": 16, "N": 64, "K": 64,
                                                                   "dtype": "float32"}}))
    assert "problems" not in one.identity() and one.problems == ()


@pytest.mark.parametrize("problems, says", [
    ([], "problems: expected a non-empty list of mappings"),
    ({"M": 16}, "problems: expected a non-empty list of mappings"),
    ([{"M": 16}, 32], "problems[1]: expected a mapping of problem keys"),
    ([{"M": 16}, {"BLOCK_M": 32}], "problems[1].BLOCK_M: also set under space:"),
    ([{"M": 16}, {"M": 16}], "problems[1]: the same problem as problems[0]"),
    ([{"M": 16, "Q": 1}, {"M": 32, "Q": 3}], "problems[0].Q: unknown key for kernel matmul"),
    ([{"M": 16}, {"M": "big"}], "problems[1].M: expected int as problems[0].M is, got 'big'"),
    # a column holds one type: 1 and "1" would both be "1", true and 1 both 1
    ([{"M": 1}, {"M": "1"}], "problems[1].M: expected int as problems[0].M is, got '1'"),
    ([{"M": 1}, {"M": True}], "problems[1].M: expected int as problems[0].M is, got True"),
    ([{"M": 1}, {"M": 1.0}], "problems[1]: the same problem as problems[0]"),
    # a problem key that varies becomes a column beside the record's own
    ([{"M": 16, "index": 1}, {"M": 16, "index": 2}],
     "problems[0].index: collides with a column of the trial table; rename the problem key"),
    ([{"M": 16, "status": "a"}, {"M": 32, "status": "b"}],
     "problems[0].status: collides with a column of the trial table"),
    ([{"M": 16}, {"M": [1, 2]}], "problems[1].M: expected a string, an integer"),
])
def test_bad_problems_are_one_line_naming_the_entry(tmp_path, problems, says):
    path = shapes_spec(tmp_path / "bad.yaml", problems=problems, constraints=[])
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert str(e.value).startswith(f"{path}: {says}"), str(e.value)
    assert "\n" not in str(e.value)


def test_a_problem_must_set_every_key_another_sets_or_problem_sets_it(tmp_path):
    path = shapes_spec(tmp_path / "bad.yaml", problem={"K": 64, "dtype": "float32"},
                       problems=[{"M": 16}, {"M": 32, "N": 64}])
    with pytest.raises(SpecError) as e:
        load_spec(path, import_kernel=False)  # as sweep run reads it first
    assert str(e.value) == (f"{path}: problems[0]: no value for N, which problems[1] sets; "
                            "set it in every problem, or under problem: for all")


def test_a_bfloat16_problem_is_refused_on_the_interpreter_naming_it(tmp_path):
    path = shapes_spec(tmp_path / "bad.yaml", problems=[{"M": 16}, {"M": 32, "dtype": "bfloat16"}])
    with pytest.raises(SpecError, match=r"problems\[1\]\.dtype: bfloat16 is not supported"):
        load_spec(path)


def test_a_bad_problem_exits_2_with_one_line_and_writes_nothing(tmp_path):
    path = shapes_spec(tmp_path / "bad.yaml", problems=[{"M": 16}, {"M": -4}], constraints=[])
    result = sweep_in("run", path, "--out", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {path}: problems[1].M: expected a number > 0, got -4"], result.stderr
    assert not (tmp_path / "run").exists()


def test_a_constraint_that_fails_against_a_problem_names_that_problem(tmp_path):
    path = shapes_spec(tmp_path / "bad.yaml", problems=[{"M": "big"}, {"M": "small"}])
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert str(e.value).startswith(f"{path}: constraints[0]: 'BLOCK_M <= M' <= needs two")
    assert str(e.value).endswith("(with problems[0])")


@pytest.mark.parametrize("key", ["node", "index", "status", "config"])
def test_a_problem_key_named_as_a_table_column_exits_2_and_writes_nothing(tmp_path, key):
    spec = write_spec(tmp_path / "sim.yaml", **{
        **SIMULATED, "problems": [{"M": 1, key: 1}, {"M": 1, key: 2}]})
    result = sweep_in("run", spec, "--out", tmp_path / "run", "--runtime", "local")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {spec}: problems[0].{key}: collides with a column of the trial table; "
        "rename the problem key"], result.stderr
    assert not (tmp_path / "run").exists()


def test_problems_differing_in_a_values_type_alone_exit_2_with_one_line(tmp_path):
    spec = write_spec(tmp_path / "sim.yaml", **{
        **SIMULATED, "problems": [{"M": 1}, {"M": "1"}]})
    result = sweep_in("run", spec, "--out", tmp_path / "run", "--runtime", "local")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {spec}: problems[1].M: expected int as problems[0].M is, got '1'; a key's "
        "values share one type"], result.stderr
    assert not (tmp_path / "run").exists()


def test_a_problem_without_a_cached_start_begins_with_its_neighbours_fastest(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", **{
        **SIMULATED, "search": {"strategy": "guided", "budget": 0.7, "warm_start": 3}}))
    space = spec.expand()
    search = PerProblem(space, spec.search, batch=6)
    first = search.propose({}, [], set())
    assert first is not None and all(space.problem_of(i) == 0 for i in first)
    # while problem 0's first outcomes are not known, the others wait
    second = search.propose({}, [first], set(first))
    assert second is not None and all(space.problem_of(i) == 0 for i in second)
    latency = {i: float(k + 1) for k, i in enumerate(first)}  # first[0] the fastest
    latency[first[1]] = None  # one that failed is no warm start
    third = search.propose(latency, [first, second], set(first) | set(second))
    assert third is not None
    of_one = [i for i in third if space.problem_of(i) == 1]
    fastest = [space.config_json(i) for i in first if latency[i] is not None][:3]
    assert [space.config_json(i) for i in of_one[:3]] == fastest
    assert not any(space.problem_of(i) == 2 for i in third)  # its neighbour has none yet


class CountingSeen(dict):
    """Outcomes that count how many of them a search reads."""

    visits = 0

    def items(self):
        for item in super().items():
            CountingSeen.visits += 1
            yield item


def test_a_search_over_many_problems_reads_each_outcome_once_a_batch(tmp_path):
    problems = 200
    spec = load_spec(write_spec(tmp_path / "s.yaml", **{
        **SIMULATED, "problems": [{"M": m} for m in range(1, problems + 1)],
        "space": {"A": list(range(64))},
        "search": {"strategy": "guided", "budget": 1.0, "warm_start": 0}}))
    space = spec.expand()
    search = PerProblem(space, spec.search, batch=2)
    batches: list[list[int]] = []
    seen = CountingSeen()
    for _ in range(3):
        CountingSeen.visits = 0
        batch = search.propose(seen, batches, {i for b in batches for i in b})
        assert batch is not None
        # a pass over the outcomes, not one per problem (400 x as many)
        assert CountingSeen.visits <= len(seen), (CountingSeen.visits, len(seen))
        seen.update({i: 1.0 + i % 7 for b in batches for i in b})
        batches.append(batch)
    assert len(seen) > 2 * problems


# Budgets past the first sample of 60 (a problem has 100 configs): less is no search
# (test_small_space.py).
@pytest.mark.parametrize("search", [{"strategy": "guided", "budget": 0.7},
                                    {"strategy": "halving", "sample": 0.7, "eta": 2}])
def test_a_search_over_problems_runs_per_problem_and_resumes_to_the_same_rows(
        tmp_path, search):
    spec = write_spec(tmp_path / "sim.yaml", **{**SIMULATED, "search": search})
    whole = sweep_in("run", spec, "--out", tmp_path / "whole", "--runtime", "local")
    assert whole.returncode == 0, whole.stderr
    rows = pq.read_table(tmp_path / "whole" / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(400))
    for m in (1, 8, 64, 512):
        mine = [r for r in rows if r["M"] == m]
        ran = [r for r in mine if r["status"] != "pruned"]
        assert len(mine) == 100 and 0 < len(ran) <= 70, (m, len(ran))
        assert f"best for M={m}: " in whole.stdout
    best = json.loads((tmp_path / "whole" / "best.json").read_text())["by_problem"]
    assert all(p["finalists"] and {f["problem"] for f in p["finalists"]} == {k}
               for k, p in enumerate(best))
    out = tmp_path / "stopped"
    assert sweep_in("run", spec, "--out", out, "--runtime", "local",
                    "--max-trials", "70").returncode == 0
    while "complete —" not in (again := sweep_in("resume", out, "--max-trials", "70")).stdout:
        assert again.returncode == 0, again.stderr
    columns = ["index", "M", "config", "status", "latency_ms"]
    assert pq.read_table(out / "trials.parquet", columns=columns).to_pylist() == \
        [{k: r[k] for k in columns} for r in rows]


def test_compile_order_hands_out_a_config_of_every_problem_together(tmp_path):
    spec = load_spec(shapes_spec(tmp_path / "s.yaml", constraints=[]))
    space = spec.expand()
    order = compile_order(space, range(len(space)))
    kernel_configs = [space.config_json(i) for i in order]
    # each kernel config's three problems go out one after another
    for k in range(0, len(order), 3):
        assert len(set(kernel_configs[k:k + 3])) == 1
        assert sorted(space.problem_of(i) for i in order[k:k + 3]) == [0, 1, 2]


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    """One real interpreter run over three problems, and the cache it filled."""
    where = tmp_path_factory.mktemp("shapes")
    spec = shapes_spec(where / "shapes.yaml")
    env = {"SWEEP_CACHE_DIR": str(where / "cache")}
    result = sweep_proc("run", spec, "--out", where / "run", env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return where, spec, result, env


def test_one_run_writes_one_table_problem_major_with_a_column_per_key(shapes_run):
    where, spec, _, _ = shapes_run
    table = pq.read_table(where / "run" / "trials.parquet")
    assert table.column_names[:2] == ["index", "M"]
    rows = table.to_pylist()
    space = load_spec(spec).expand()
    assert [r["index"] for r in rows] == list(range(len(space)))
    assert [r["M"] for r in rows] == [space.config(i)["M"] for i in range(len(space))]
    assert all("M" not in json.loads(r["config"]) for r in rows)
    assert {r["status"] for r in rows} == {"ok"}


def test_best_json_has_each_problems_best_finalists_and_the_summary_a_line_each(shapes_run):
    where, _, result, _ = shapes_run
    best = json.loads((where / "run" / "best.json").read_text())
    rows = pq.read_table(where / "run" / "trials.parquet").to_pylist()
    assert [p["problem"]["M"] for p in best["by_problem"]] == [16, 32, 64]
    for p, mine in enumerate(best["by_problem"]):
        own = [r for r in rows if r["M"] == mine["problem"]["M"]]
        assert mine["first_index"] == own[0]["index"] and mine["configs"] == len(own)
        # the winner is one of the problem's own configs, chosen by its re-timing
        assert mine["index"] in {r["index"] for r in own}
        assert mine["config"] == json.loads(rows[mine["index"]]["config"])
        timed = {f["index"]: f["latency_ms"] for f in mine["finalists"]}
        assert {f["problem"] for f in mine["finalists"]} == {p}
        assert set(timed) <= {r["index"] for r in own} and len(timed) == 2
        assert mine["latency_ms"] == min(timed.values())
        line = f"  best for M={mine['problem']['M']}: #{mine['index']} "
        assert line in result.stdout, result.stdout
    # the head of best.json is the first problem's, as a reader of one problem expects
    assert best["index"] == best["by_problem"][0]["index"]


def test_the_cache_gets_an_entry_per_problem_and_launch_code_finds_each(shapes_run,
                                                                          monkeypatch):
    where, _, _, env = shapes_run
    monkeypatch.setenv("SWEEP_CACHE_DIR", env["SWEEP_CACHE_DIR"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    best = json.loads((where / "run" / "best.json").read_text())
    entries = cache.of_kernel("matmul")
    assert sorted(e.problem["M"] for e in entries) == [16, 32, 64]
    from sweep.tuned import tuned_entry

    for mine in best["by_problem"]:
        entry = tuned_entry("matmul", mine["problem"])
        assert entry is not None and dict(entry.config) == mine["config"]
        assert entry.distance == 0


def test_the_same_sweep_again_is_answered_from_the_cache_for_every_problem(shapes_run):
    where, spec, _, env = shapes_run
    result = sweep_proc("run", spec, "--out", where / "again", env=env)
    assert result.returncode == 0, result.stderr
    cached = [line for line in result.stdout.splitlines() if "cached —" in line]
    assert [json.loads(line.split("matmul ")[1].split(" completed")[0])["M"]
            for line in cached] == [16, 32, 64]
    assert not (where / "again").exists()


SIMULATED = dict(
    name="sim-shapes", kernel="matmul", problem={"N": 64},
    problems=[{"M": m} for m in (1, 8, 64, 512)],
    space={"A": list(range(10)), "B": list(range(10))},
    run={"backend": "simulate", "snapshot_every_s": 0.5, "finalists": 3},
    simulate={"workers": 2, "trial_ms": 4})


def test_a_sigint_then_resume_gives_each_problems_rows_once_as_an_unstopped_run(tmp_path):
    spec = write_spec(tmp_path / "sim.yaml", **SIMULATED)
    whole = sweep_in("run", spec, "--out", tmp_path / "whole", "--runtime", "local")
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "sweep", "run", spec, "--out", out,
                             "--runtime", "local"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.read_text().count("\n") >= 20):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "best for M=1: " in stdout
    again = sweep_in("resume", out)
    assert again.returncode == 0, again.stderr
    columns = ["index", "M", "config", "status", "latency_ms"]
    mine = pq.read_table(out / "trials.parquet", columns=columns).to_pylist()
    theirs = pq.read_table(tmp_path / "whole" / "trials.parquet", columns=columns).to_pylist()
    assert mine == theirs and len(mine) == 400
    a = json.loads((out / "best.json").read_text())["by_problem"]
    b = json.loads((tmp_path / "whole" / "best.json").read_text())["by_problem"]
    assert [p["index"] for p in a] == [p["index"] for p in b]
    assert all(p["first_index"] == 100 * k for k, p in enumerate(a))


def test_the_api_answers_a_cached_sweep_over_problems_problem_by_problem(shapes_run,
                                                                           monkeypatch):
    where, spec, _, env = shapes_run
    monkeypatch.setenv("SWEEP_CACHE_DIR", env["SWEEP_CACHE_DIR"])
    from sweep import api

    result = api.run(spec, out=where / "api", quiet=True)
    best = json.loads((where / "run" / "best.json").read_text())["by_problem"]
    assert result.state == "cached"
    assert [p.problem["M"] for p in result.by_problem] == [16, 32, 64]
    assert [p.best.config for p in result.by_problem if p.best] == [p["config"] for p in best]
    assert result.best is not None and result.best.config == best[0]["config"]


def test_trials_the_driver_records_itself_hold_the_kernels_config_and_the_run_reads_back(
        tmp_path):
    # crashed and timeout rows are written by the driver, not by a worker
    spec = write_spec(tmp_path / "faults.yaml", **{
        **SIMULATED, "problems": [{"M": 1}, {"M": 8}], "space": {"A": list(range(12))},
        "run": {"backend": "simulate", "trial_timeout_s": 1.5, "max_retries": 0},
        "simulate": {"workers": 2, "trial_ms": 1, "seed": 1, "crash_rate": 0.15,
                     "hang_rate": 0.1}})
    first = sweep_in("run", spec, "--out", tmp_path / "run", "--runtime", "local")
    assert first.returncode == 0, first.stderr
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert {"crashed", "timeout"} <= {r["status"] for r in rows}
    assert [r["index"] for r in rows] == list(range(24))
    assert all("M" not in json.loads(r["config"]) for r in rows)
    again = sweep_in("resume", tmp_path / "run")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr


def test_a_bfloat16_problem_with_backend_auto_is_refused_where_the_interpreter_runs(tmp_path):
    path = shapes_spec(tmp_path / "bad.yaml", problems=[{"M": 16}, {"M": 32, "dtype": "bfloat16"}],
                       run={"backend": "auto"})
    result = sweep_in("run", path, "--out", tmp_path / "run", "--runtime", "local")
    assert result.returncode == 2
    assert "problems[1].dtype: bfloat16 is not supported" in result.stderr, result.stderr


def test_sweep_best_of_a_spec_over_problems_lists_each_problems_cache_entry(shapes_run):
    _, spec, _, env = shapes_run
    result = sweep_in("best", spec, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert [e["problem"]["M"] for e in json.loads(result.stdout)] == [16, 32, 64]


def test_a_run_over_many_problems_digests_its_spec_a_bounded_number_of_times(
        tmp_path, monkeypatch):
    from sweep.spec import model

    problems = 300
    spec = write_spec(tmp_path / "many.yaml", **{
        **SIMULATED, "problems": [{"M": m} for m in range(1, problems + 1)],
        "space": {"A": [1, 2]}, "run": {"backend": "simulate", "finalists": 0}})
    calls = 0
    digest = model._digest

    def counted(identity):
        nonlocal calls
        calls += 1
        return digest(identity)

    monkeypatch.setattr(model, "_digest", counted)
    result = sweep_in("run", spec, "--out", tmp_path / "run", "--runtime", "local")
    assert result.returncode == 0, result.stderr
    # each digest reads every problem: one per problem (a cache entry's) is quadratic
    assert calls < 20, calls


def test_a_cached_answer_over_many_problems_looks_each_entry_up_in_its_own_problem(
        tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from sweep.run import cache_policy

    problems = 300
    spec = load_spec(write_spec(tmp_path / "many.yaml", **{
        **SIMULATED, "problems": [{"M": m} for m in range(1, problems + 1)],
        "space": {"A": [1, 2, 3]}}))
    space = spec.expand()
    hits = [cache.CacheEntry(kernel="matmul", kernel_source="s", problem=dict(p),
                             backend="cuda", device="gpu", config={"A": 2}, latency_ms=1.0,
                             fingerprint="f", run_dir=str(tmp_path), partial=False,
                             written_at=0.0) for p in reversed(spec.problems)]
    scanned = 0
    looked_up = cache_policy.indices_of

    def counted(where, configs):
        nonlocal scanned
        scanned += len(where)
        return looked_up(where, configs)

    monkeypatch.setattr(cache_policy, "indices_of", counted)
    out = io.StringIO()
    cache_policy.print_cached(Console(file=out, width=200), spec, space, hits)
    said = [line for line in out.getvalue().splitlines() if "cached —" in line]
    assert [line.split('"M":')[1].split(",")[0] for line in said] == \
        [str(m) for m in range(1, problems + 1)]  # in the spec's order
    assert "outside" not in out.getvalue()
    assert scanned == len(space)  # each entry within its own problem's configs
