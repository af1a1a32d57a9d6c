"""Issue 35 end to end on the CPU: a program with autotuned kernels (tests/programs/
autotuned_app.py: a fused add + RMS norm writing two outputs, a gather by an index tensor)
captured by `sweep capture`, tuned by `sweep run` on the interpreter, and run again with the
answers loaded, by `sweep exec` and by `sweep.autotune.use`, with no change to its code.
Under the interpreter Triton's own benchmarker raises, so the loaded program finishing at all
shows it never reached it; each kernel's tuner holds the run's best for each key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import sweep_proc

from storage.capture import read_capture

PROGRAMS = Path(__file__).parent / "programs"
ROOT = Path(__file__).resolve().parents[1]
REPORT = """
import json, sys
import sweep.autotune
loaded = sweep.autotune.use(sys.argv[1])
import autotuned_app, autotuned_kernels as k
autotuned_app.main([])
picked = {}
for name in ("add_norm", "gather_rows"):
    tuner = getattr(k, name)
    while not hasattr(tuner, "configs"):
        tuner = tuner.fn
    picked[name] = {repr(key): {**c.kwargs, "num_warps": c.num_warps,
                                "num_stages": c.num_stages} for key, c in tuner.cache.items()}
print(json.dumps(picked))
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    env.pop("AUTOTUNED_APP_CPU_BENCH", None)
    return env


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict[str, Path]:
    """The app copied where a user's program would be, captured and tuned once."""
    home = tmp_path_factory.mktemp("e2e")
    app = home / "app"
    app.mkdir()
    for name in ("autotuned_app.py", "autotuned_kernels.py"):
        shutil.copy(PROGRAMS / name, app)
    env = {**_env(), "SWEEP_CACHE_DIR": str(home / "cache")}
    captured = sweep_proc("capture", "--out", home / "cap", "--", sys.executable,
                          "autotuned_app.py", cwd=app, env=env)
    assert captured.returncode == 0, captured.stderr
    ran = sweep_proc("run", home / "cap" / "spec.yaml", "--out", home / "run", cwd=home,
                     env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    return {"home": home, "app": app, "run": home / "run", "cap": home / "cap",
            "captured_out": captured.stdout}


def test_one_run_tunes_every_captured_kernel_and_key_in_one_table(tuned):
    calls = read_capture(tuned["cap"]).calls
    assert {(c.kernel, c.label) for c in calls} == {
        ("autotuned_kernels:add_norm", "N=24; float32"),
        ("autotuned_kernels:add_norm", "N=48; float32"),
        ("autotuned_kernels:gather_rows", "D=16; float32/int64"),
        ("autotuned_kernels:gather_rows", "D=40; float32/int64")}
    rows = pq.read_table(tuned["run"] / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(len(rows)))
    assert len(rows) == sum(len(c.configs) for c in calls)
    assert all(r["status"] == "ok" and r["validation"] == "passed" for r in rows)
    # A column per parameter of any kernel, null where a kernel has none.
    assert {r["BLOCK"] is None for r in rows} == {True, False}
    assert all((r["BLOCK"] is None) == (r["kernel"] == "autotuned_kernels:gather_rows")
               for r in rows)


def _bests(run: Path) -> dict[tuple[str, str], dict]:
    doc = json.loads((run / "best.json").read_text())
    return {(p["problem"]["kernel"], p["problem"]["key"]): p["config"]
            for p in doc["by_problem"]}


def test_the_program_run_by_sweep_exec_launches_the_tuned_configs_without_tuning(tuned):
    done = subprocess.run([sys.executable, "-m", "sweep", "exec", str(tuned["run"]), "--",
                           sys.executable, "autotuned_app.py"], cwd=tuned["app"], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("checksum ")
    assert "sweep exec: 4 tuned keys of 2 kernels from " in done.stderr
    # The same program without the run reaches Triton's benchmarker, which raises here.
    plain = subprocess.run([sys.executable, "autotuned_app.py"], cwd=tuned["app"],
                           env=_env(), capture_output=True, text=True, timeout=300)
    assert plain.returncode != 0 and "active drivers" in plain.stderr


def test_use_fills_each_tuner_with_the_runs_best_for_each_key(tuned):
    done = subprocess.run([sys.executable, "-c", REPORT, str(tuned["run"])],
                          cwd=tuned["app"], env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    picked = json.loads(done.stdout.splitlines()[-1])
    calls = {(c.kernel, c.label): c for c in read_capture(tuned["cap"]).calls}
    for (kernel, label), best in _bests(tuned["run"]).items():
        key = repr(tuple(calls[(kernel, label)].key))
        got = picked[kernel.partition(":")[2]][key]
        assert got == {k: v for k, v in best.items() if k not in ("num_ctas", "maxnreg")}


def test_a_captures_run_stops_resumes_reports_and_answers_as_any_run(tuned):
    """What holds for a run holds here: a run cut short by --max-trials resumes to each
    config once; the report, `sweep best` and the dispatch module read it; the same spec
    run again is answered from the best-config cache, per problem."""
    home, env = tuned["home"], {**_env(), "SWEEP_CACHE_DIR": str(tuned["home"] / "cache2")}
    spec, run = tuned["cap"] / "spec.yaml", home / "cut"
    first = sweep_proc("run", spec, "--out", run, "--max-trials", "5", cwd=home, env=env,
                       timeout=300)
    assert first.returncode == 0, first.stderr
    assert len(pq.read_table(run / "trials.parquet")) == 5
    resumed = sweep_proc("resume", run, cwd=home, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    rows = pq.read_table(run / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(12))
    assert sweep_proc("report", run, cwd=home, env=env).returncode == 0
    module = home / "tuned_app.py"
    best = sweep_proc("best", run, "--python", module, cwd=home, env=env)
    assert best.returncode == 0, best.stderr
    assert "gather_rows" in module.read_text()
    again = sweep_proc("run", spec, "--out", home / "again", cwd=home, env=env)
    assert again.returncode == 0, again.stderr
    assert "cached" in again.stdout + again.stderr


def test_a_run_of_one_problem_of_the_capture_is_loaded(tuned):
    """A spec cut to one problem (best.json then has no by_problem): its key is loaded."""
    import yaml

    home = tuned["home"]
    doc = yaml.safe_load((tuned["cap"] / "spec.yaml").read_text())
    doc["problems"] = doc["problems"][2:3]
    spec = tuned["cap"] / "one.yaml"
    spec.write_text(yaml.safe_dump(doc))
    env = {**_env(), "SWEEP_CACHE_DIR": str(home / "cache3")}
    ran = sweep_proc("run", spec, "--out", home / "one", cwd=home, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    done = subprocess.run([sys.executable, "-c", "import sys, sweep.autotune; "
                           "print(sweep.autotune.use(sys.argv[1]).keys)", str(home / "one")],
                          cwd=tuned["app"], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]
