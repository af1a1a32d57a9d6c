"""`sweep best` of a run over problems (`problems:`): a JSON line and a triton.Config line
per problem, `--json` one entry each, `--python PATH` a dispatch module that launch code
imports without this project, and the Python API's `by_problem`. One real interpreter run,
shared by the module's tests."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import triton
from conftest import SHAPES, simulate_spec, sweep_in, sweep_proc, write_spec

from sweep import api
from sweep.dispatch import HEADER, Table, Tuned, module_text


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One real interpreter run over three problems (about 12 s), and its best.json's
    by_problem."""
    where = tmp_path_factory.mktemp("shapes")
    spec = write_spec(where / "shapes.yaml", **SHAPES)
    done = sweep_proc("run", spec, "--out", where / "run", timeout=300,
                      env={"SWEEP_CACHE_DIR": str(where / "cache")})
    assert done.returncode == 0, done.stderr
    return where / "run", json.loads((where / "run" / "best.json").read_text())["by_problem"]


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"dispatch_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_best_prints_a_json_line_and_a_triton_config_line_per_problem(shapes):
    run, by_problem = shapes
    done = sweep_in("best", run)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 * len(by_problem) == 6
    for (shown, line), mine in zip(zip(lines[::2], lines[1::2]), by_problem):
        entry = json.loads(shown)
        assert entry["problem"] == mine["problem"] and entry["problem"]["M"] in (16, 32, 64)
        assert (entry["config"], entry["index"], entry["device"]) == \
            (mine["config"], mine["index"], mine["device"])
        assert entry["partial"] is False and entry["run_dir"] == str(run.resolve())
        config = eval(line, {"triton": triton})  # the line a user pastes
        assert config.kwargs == mine["config"]
    assert [json.loads(s)["problem"]["M"] for s in lines[::2]] == [16, 32, 64]


def test_sweep_best_json_is_one_list_with_an_entry_per_problem(shapes):
    run, by_problem = shapes
    done = sweep_in("best", run, "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [e["problem"] for e in listed] == [p["problem"] for p in by_problem]
    assert [(e["config"], e["latency_ms"]) for e in listed] == \
        [(p["config"], p["latency_ms"]) for p in by_problem]


def test_the_python_module_answers_each_problem_and_the_nearest_size(shapes, tmp_path):
    run, by_problem = shapes
    path = tmp_path / "matmul_configs.py"
    done = sweep_in("best", run, "--python", path)
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    assert text.splitlines()[0] == HEADER
    module = load_module(path)
    assert str(run.resolve()) in module.__doc__ and "cpu-interpreter" in module.__doc__
    assert "PARTIAL" not in module.__doc__
    assert (module.KERNEL, module.DEVICE, module.PARTIAL) == ("matmul", "cpu-interpreter",
                                                              False)
    assert [row["problem"] for row in module.TABLE] == [p["problem"] for p in by_problem]
    first, mid, last = by_problem
    asked = dict(mid["problem"])
    assert module.config_for(asked) == mid["config"]  # the very problem
    # M = 40 is nearer 32 than 64 (log2 ratios 0.32 and 0.68); 48 nearer 64.
    assert module.config_for({**asked, "M": 40}) == mid["config"]
    assert module.config_for({**asked, "M": 48}) == last["config"]
    assert module.config_for({**asked, "M": 4096}) == last["config"]
    assert module.config_for({**asked, "M": 2}) == first["config"]
    assert module.config_for({**asked, "dtype": "float16"}) is None  # nothing alike
    assert module.config_for(asked, device="NVIDIA H100") is None
    with pytest.raises(ValueError, match="expected the problem keys M, N, K, dtype"):
        module.config_for({"M": 32})
    config = module.triton_config({**asked, "M": 40})
    assert isinstance(config, triton.Config) and config.kwargs == mid["config"]
    assert module.triton_config({**asked, "dtype": "float16"}) is None
    # Written again over its own module: replaced, not refused.
    assert sweep_in("best", run, "--python", path).returncode == 0


def test_the_python_module_needs_nothing_but_the_standard_library(shapes, tmp_path):
    run, by_problem = shapes
    done = sweep_in("best", run, "--python", "-")
    assert done.returncode == 0 and done.stdout.splitlines()[0] == HEADER
    (tmp_path / "tuned.py").write_text(done.stdout)
    top = {n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
           for n in ast.parse(done.stdout).body if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert top == {"__future__", "math", "collections.abc", "typing"}
    # -S: no site-packages (neither this project nor triton); -I: nothing of the caller's.
    asked = {**by_problem[0]["problem"], "M": 20}
    code = ("import importlib.util, json, sys; sys.path.insert(0, '.'); "
            "assert not any(map(importlib.util.find_spec, ('sweep', 'storage', 'triton'))); "
            f"import tuned; print(json.dumps(tuned.config_for({asked!r})))")
    got = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == by_problem[0]["config"]


def test_a_file_the_command_did_not_write_is_never_replaced(shapes, tmp_path):
    run, _ = shapes
    mine = tmp_path / "configs.py"
    mine.write_text("CONFIGS = {}  # the user's own\n")
    done = sweep_in("best", run, "--python", mine)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert "exists and is not a module `sweep best --python` wrote" in done.stderr
    assert mine.read_text() == "CONFIGS = {}  # the user's own\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs.py"]  # no temp left
    assert sweep_in("best", run, "--python", tmp_path).returncode == 2  # a directory
    assert sweep_in("best", run, "--python", tmp_path / "no" / "such.py").returncode == 2
    assert sweep_in("best", run, "--python", "-", "--json").returncode == 2


def test_the_api_gives_each_problems_best(shapes):
    run, by_problem = shapes
    result = api.load(run)
    assert [p.problem for p in result.by_problem] == [p["problem"] for p in by_problem]
    for mine, doc in zip(result.by_problem, by_problem):
        assert mine.best is not None
        assert (mine.best.config, mine.best.index, mine.best.latency_ms, mine.best.device) == \
            (doc["config"], doc["index"], doc["latency_ms"], doc["device"])
        assert set(mine.by_device) == {"cpu-interpreter"}
        assert mine.finalists == doc["finalists"]
    assert result.best == result.by_problem[0].best  # the head is the first problem's


def test_a_run_of_one_problem_prints_as_before_and_its_module_is_a_table_of_one(tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", problem={"M": 128, "dtype": "float16"},
                         space={"BLOCK": [16, 32, 64], "num_warps": [2, 4]})
    done = sweep_in("run", spec, "--out", tmp_path / "run", "--max-trials", "4")
    assert done.returncode == 0, done.stderr
    shown, line = sweep_in("best", tmp_path / "run").stdout.splitlines()
    assert "problem" not in json.loads(shown) and json.loads(shown)["partial"] is True
    assert line.startswith("triton.Config(")
    assert api.load(tmp_path / "run").by_problem == []
    assert sweep_in("best", tmp_path / "run", "--python", tmp_path / "t.py").returncode == 0
    module = load_module(tmp_path / "t.py")
    assert module.PARTIAL is True and "PARTIAL" in module.__doc__  # a stopped run's
    best = json.loads(shown)
    (row,) = module.TABLE
    assert row == {"problem": {"M": 128, "dtype": "float16"}, "config": best["config"],
                   "device": best["device"], "latency_ms": best["latency_ms"],
                   "index": best["index"]}
    assert module.config_for({"M": 100, "dtype": "float16"}) == best["config"]
    config = module.triton_config({"M": 128, "dtype": "float16"})
    assert config.num_warps == best["config"]["num_warps"] and "num_warps" not in config.kwargs


def test_the_module_fills_in_the_kernels_defaults_and_a_tie_goes_to_the_larger(tmp_path):
    """The rule alone, on a table made by hand: no run needed."""
    def tuned(m: int, block: int) -> Tuned:
        return Tuned({"M": m, "dtype": "float16"}, {"BLOCK": block, "num_warps": 4}, "GPU",
                     1.0, 0, {"GPU": {"BLOCK": block, "num_warps": 4}})

    table = Table(kernel="k", name="n", run_dir="/r\"\"\"\\x", fingerprint="f",
                  started_at=0.0, partial=False,
                  problems=[tuned(16, 1), tuned(64, 2),
                            Tuned({"M": 256, "dtype": "float16"}, None, None, None, None)],
                  defaults={"dtype": "float16"}, launch_options=("num_warps",))
    path = tmp_path / "k.py"
    path.write_text(module_text(table))
    module = load_module(path)
    assert module.RUN_DIR == "/r\"\"\"\\x"  # a hostile path stays a string
    assert module.config_for({"M": 32}) == {"BLOCK": 2, "num_warps": 4}  # 16 and 64: a tie
    assert module.config_for({"M": 16}) == {"BLOCK": 1, "num_warps": 4}
    assert module.config_for({"M": 256}) == {"BLOCK": 2, "num_warps": 4}  # untuned
    assert module.UNTUNED == [{"M": 256, "dtype": "float16"}]
    assert "No config succeeded for: M=256 dtype='float16'" in " ".join(
        module.__doc__.split())
