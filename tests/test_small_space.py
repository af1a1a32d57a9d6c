"""A space too small to search (sweep/search/strategies.py, searches()): where a search's
budget ends within its first sample, every config runs, and the run says so."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import yaml
from conftest import ROOT, sweep_cli, sweep_in, write_spec

from sweep.search.per_problem import PerProblem
from sweep.search.plan import plan_search
from sweep.search.strategies import (
    INITIAL,
    Everything,
    Guided,
    Halving,
    Search,
    most,
    searches,
    strategy,
)
from sweep.spec import load_spec
from sweep.spec.search_options import SearchOptions

TABLE = ROOT / "benchmarks/tables/matmul64-h200.parquet"
LOCAL = ("--runtime", "local")


def test_a_budget_within_the_first_sample_runs_every_config_and_a_larger_one_searches():
    guided, halving = SearchOptions("guided"), SearchOptions("halving")
    assert INITIAL == 60
    # guided's budget, 0.2 of the space: 13 of 64, 60 of 300 end within the first 60
    assert not searches(guided, 64) and not searches(guided, 300)
    assert searches(guided, 301) and searches(guided, 1800)
    # halving's first rung, 0.25 of the space: 60 of 240 is a sample no larger
    assert not searches(halving, 240) and searches(halving, 241)
    assert not searches(SearchOptions(), 10_000)  # exhaustive searches nothing
    # A spec's larger batch is the first sample: 80 of 400 end within a batch of 100.
    assert not searches(SearchOptions("guided", batch=100), 400)
    assert searches(SearchOptions("guided", batch=100), 600)
    # Only the spec's budget is small, on a space the default searches: as asked.
    assert searches(SearchOptions("guided", budget=0.01), 1000)


def test_a_small_spaces_strategy_proposes_every_config_once_and_a_large_ones_searches():
    small = load_spec(ROOT / "configs/matmul.yaml", import_kernel=False).expand()
    large = load_spec(ROOT / "configs/matmul-1800.yaml", import_kernel=False).expand()
    for options in (SearchOptions("guided", seed=3), SearchOptions("halving", seed=3)):
        mine = strategy(small, options, 15)
        assert isinstance(mine, Everything)
        search = Search(mine, {})
        assert sorted(search.advance()) == list(range(64))
        search.known.update({i: 1.0 for i in range(64)})
        assert search.advance() == [] and search.settled() and search.pruned(64) == []
        assert most(options, small.sizes) is None  # the bar counts the whole space
        assert isinstance(strategy(large, options, 15), (Guided, Halving))
        assert most(options, large.sizes) == options.budget_configs(1800)
    # Over problems, each problem's space decides for itself.
    assert most(SearchOptions("guided"), (64, 1800)) == 64 + 360


def test_a_too_small_problem_in_a_sweep_over_problems_runs_all_its_configs_at_once(
        tmp_path):
    spec = write_spec(tmp_path / "p.yaml", name="p", kernel="matmul",
                      problems=[{"M": 64, "N": 64, "K": 64}, {"M": 128, "N": 64, "K": 64}],
                      space={"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128],
                             "BLOCK_K": [16, 32], "num_warps": [2, 4]},
                      run={"backend": "simulate"}, search={"strategy": "guided", "seed": 1})
    space = load_spec(spec).expand()
    assert space.sizes == (64, 64)
    both = PerProblem(space, SearchOptions("guided", seed=1), 8)
    # The second problem does not wait for the first's outcomes: every config, at once.
    assert sorted(both.propose({}, [], set()) or []) == list(range(128))
    plan, line = plan_search(load_spec(spec), space, "simulate", 1, 0)
    assert plan is not None and plan.warm == () and line == (
        "search: guided's budget ends within its first sample of 60 configs in each of the "
        "2 problems (at most 64 configs each): a seeded sample's best at most, so every "
        "config runs instead (exhaustive)")


def replayed_spec(tmp_path: Path) -> Path:
    """configs/matmul.yaml, guided, replayed fast from the recorded H200 table."""
    doc = yaml.safe_load((ROOT / "configs/matmul.yaml").read_text())
    doc.update(search={"strategy": "guided", "seed": 0},
               run={"backend": "replay", "trial_timeout_s": 60},
               replay={"table": str(TABLE), "workers": 1, "compile_slots": 4,
                       "time_scale": 0.005})
    return write_spec(tmp_path / "m.yaml", **doc)


def test_a_guided_run_of_matmul_yamls_64_configs_says_so_runs_all_and_picks_the_best(
        tmp_path):
    spec = replayed_spec(tmp_path)
    out = tmp_path / "run"
    result = sweep_in("run", spec, "--out", out, *LOCAL)
    assert result.returncode == 0, result.stderr
    assert ("search: guided's budget, 13 of 64 configs, ends within its first sample of "
            "60: a seeded sample's best at most, so all 64 run instead (exhaustive)"
            in result.stderr)
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 64  # none pruned
    recorded = pq.read_table(TABLE).to_pylist()
    fastest = min(recorded, key=lambda r: r["latency_ms"])
    assert json.loads((out / "best.json").read_text())["index"] == fastest["index"]
    # The spec's identity is still its search's: the cache answers a guided spec only.
    meta = json.loads((out / "run.json").read_text())
    exhaustive = write_spec(tmp_path / "e.yaml", **{
        **yaml.safe_load(spec.read_text()), "search": "exhaustive"})
    assert meta["fingerprint"] == load_spec(spec).fingerprint != load_spec(
        exhaustive).fingerprint


def test_a_small_space_run_stopped_and_resumed_runs_each_config_once(tmp_path):
    spec = replayed_spec(tmp_path)
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, *LOCAL, "--max-trials", "20") == 0
    assert sweep_cli("resume", out, *LOCAL) == 0
    journaled = [json.loads(line)["index"]
                 for line in (out / "journal.jsonl").read_text().splitlines()]
    assert sorted(journaled) == list(range(64))
    assert json.loads((out / "snapshot.json").read_text())["snapshot"]["state"] == "complete"
