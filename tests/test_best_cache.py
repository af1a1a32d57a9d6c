"""The best-config cache as users meet it: it keeps the best a run found (not the last
run's), a run it can answer is not run again unless forced, `sweep best` prints a config
to paste, and sweep.tuned hands it to a user's launch code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import triton
import yaml
from conftest import ROOT, simulate_spec, sweep_cli, sweep_proc, write_spec

from actors.simulate import draws
from storage.cache import CacheEntry, answering, library_versions, lookup
from sweep import api
from sweep.spec import load_spec
from sweep.tuned import triton_config, tuned_config, tuned_entry

SPACE = {"A": list(range(8)), "B": list(range(5))}
SEED = 0
PROBLEM = {"rows": 4, "cols": 64, "dtype": "float32"}


def fastest(space_configs: list[dict]) -> dict:
    """The config with the lowest simulated latency (the simulate backend's draws)."""
    return min(space_configs, key=lambda c: draws(SEED, c)[1])


def test_a_slower_run_does_not_replace_a_cached_best(tmp_path, capsys):
    full = simulate_spec(tmp_path / "full.yaml", space=SPACE, run={"finalists": 0})
    every = [{"A": a, "B": b} for a in SPACE["A"] for b in SPACE["B"]]
    best = fastest(every)
    # The same kernel and problem over a space without the fastest config: slower.
    without = {"A": [a for a in SPACE["A"] if a != best["A"]], "B": SPACE["B"]}
    part = simulate_spec(tmp_path / "part.yaml", space=without, run={"finalists": 0})

    assert sweep_cli("run", full, "--out", tmp_path / "full") == 0
    (entry,) = lookup("matmul", "", {})
    assert dict(entry.config) == best and entry.run_dir == str((tmp_path / "full").resolve())
    capsys.readouterr()
    assert sweep_cli("run", part, "--out", tmp_path / "part") == 0
    assert "the best-config cache keeps its entry from" in capsys.readouterr().err
    (kept,) = lookup("matmul", "", {})
    assert replace(kept, runs=(), declared=()) == replace(entry, runs=(), declared=())
    # Both complete sweeps are on record (either one is answered from the cache).
    assert set(kept.runs) == {load_spec(full).fingerprint, load_spec(part).fingerprint}
    # A stopped run's best, cached on request, never replaces a complete run's either.
    assert sweep_cli("run", full, "--out", tmp_path / "stopped", "--max-trials", "30",
                     "--cache-partial") == 0
    (still,) = lookup("matmul", "", {})
    assert still == kept
    assert (still.versions, still.partial) == (library_versions(), False)


def test_a_complete_run_replaces_a_partial_entry_even_when_slower(tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space=SPACE, run={"finalists": 0})
    assert sweep_cli("run", spec, "--out", tmp_path / "a", "--max-trials", "39",
                     "--cache-partial") == 0
    (partial,) = lookup("matmul", "", {})
    assert partial.partial
    without = {"A": SPACE["A"], "B": [b for b in SPACE["B"]
                                      if b != partial.config["B"]]}
    other = simulate_spec(tmp_path / "o.yaml", space=without, run={"finalists": 0})
    assert sweep_cli("run", other, "--out", tmp_path / "b") == 0
    (entry,) = lookup("matmul", "", {})
    assert not entry.partial and entry.run_dir == str((tmp_path / "b").resolve())


def softmax_spec(path: Path) -> Path:
    return write_spec(path, name="tiny-softmax", kernel="softmax",
                      problem={"rows": 4, "cols": 64, "dtype": "float32"},
                      space={"BLOCK_N": [32, 64], "ROWS_PER_PROGRAM": [1],
                             "num_warps": [1, 2]},
                      timing={"warmup_ms": 1, "rep_ms": 3, "screen": "off"},
                      run={"backend": "interpret", "finalists": 0})


def test_a_cached_interpreter_run_answers_the_next_and_launch_code(tmp_path,
                                                                    capsys):
    spec = softmax_spec(tmp_path / "spec.yaml")
    problem = {"rows": 4, "cols": 64, "dtype": "float32"}
    fallback = {"BLOCK_N": 16, "ROWS_PER_PROGRAM": 1}
    assert tuned_config("softmax", problem, default=fallback,
                        device="cpu-interpreter") == fallback
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    said = capsys.readouterr()
    assert said.err.count("Triton's interpreter ignores num_warps") == 1
    best = json.loads((tmp_path / "a" / "best.json").read_text())
    # The interpreter ignores launch options: the cache keeps what it can tell apart.
    tuned = {k: v for k, v in best["config"].items() if k != "num_warps"}
    (entry,) = lookup("softmax", entry_source(), {**problem})
    assert dict(entry.config) == tuned and entry.backend == "interpret"

    assert tuned_config("softmax", problem, default=fallback,
                        device="cpu-interpreter") == tuned
    # Another size is answered from the nearest tuned one; with nearest=False, or on
    # another device, the fallback.
    assert tuned_config("softmax", {**problem, "cols": 128}, default=fallback,
                        device="cpu-interpreter") == tuned
    assert tuned_config("softmax", {**problem, "cols": 128}, default=fallback,
                        device="cpu-interpreter", nearest=False) == fallback
    assert tuned_config("softmax", problem, default=fallback, device="NVIDIA H200") == fallback
    assert tuned_entry("softmax", problem, "cpu-interpreter").run_dir == \
        str((tmp_path / "a").resolve())

    # The next run of the same spec is answered from the cache: nothing runs, nothing
    # is written.
    assert sweep_cli("run", spec, "--out", tmp_path / "b") == 0
    out = capsys.readouterr().out
    assert "cached" in out and "pass --force to tune again" in out
    assert not (tmp_path / "b").exists()
    result = api.run(spec, out=tmp_path / "c", quiet=True)
    assert (result.state, result.run_dir, result.best.config) == \
        ("cached", (tmp_path / "a").resolve(), tuned)
    assert not (tmp_path / "c").exists()
    # Where the best came from, in that run's table, as a run's result says it.
    assert result.best.index == best["index"]
    assert tuned_config("softmax", problem, device="cpu-interpreter") == tuned
    assert tuned_config("softmax", {**problem, "cols": 128}, device="cpu-interpreter",
                        nearest=False) is None
    assert sweep_cli("run", spec, "--out", tmp_path / "d", "--force") == 0
    assert (tmp_path / "d" / "trials.parquet").exists()

    # With the run directories the cache names gone, there is nothing to show where an
    # answer came from: the sweep is tuned again, and says why.
    capsys.readouterr()
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "d")
    assert sweep_cli("run", spec, "--out", tmp_path / "e") == 0
    err = capsys.readouterr().err
    assert "which is gone: tuning again" in err, err
    assert (tmp_path / "e" / "trials.parquet").exists()
    (entry,) = lookup("softmax", entry_source(), {**problem})
    assert entry.run_dir == str((tmp_path / "e").resolve())  # whatever its latency


def entry_source() -> str:
    from sweep_kernels import load_kernel, source_digest

    return source_digest("softmax", load_kernel("softmax"))


def cached(problem: dict, config: dict, *, partial: bool = False,
           fixed: dict | None = None) -> None:
    """A softmax entry for this problem on the interpreter, as a sweep of it leaves."""
    from storage.cache import store

    store(CacheEntry(kernel="softmax", kernel_source=entry_source(), problem=problem,
                     backend="interpret", device="cpu-interpreter", config=config,
                     latency_ms=1.0, fingerprint="f", run_dir=f"/runs/{sorted(problem.items())}",
                     partial=partial, written_at=time.time(), versions=library_versions(),
                     fixed=fixed or {}))


def test_launch_code_gets_the_nearest_tuned_size_of_the_same_dtype():
    for cols, block in ((64, 32), (1024, 256), (8192, 512)):
        cached({"rows": 4, "cols": cols, "dtype": "float32"}, {"BLOCK_N": block})
    cached({"rows": 4, "cols": 128, "dtype": "float16"}, {"BLOCK_N": 8})
    asked = {"rows": 4, "cols": 128, "dtype": "float32"}

    def near(problem: dict, **kw) -> dict | None:
        return tuned_config("softmax", problem, device="cpu-interpreter", **kw)

    # 128 is one doubling from 64 and three from 1024; float16's exact size is no answer.
    assert near(asked) == {"BLOCK_N": 32}
    entry = tuned_entry("softmax", asked, "cpu-interpreter")
    assert (entry.problem["cols"], entry.distance) == (64, 1.0)
    assert near({**asked, "cols": 4096}) == {"BLOCK_N": 512}  # 1 from 8192, 2 from 1024
    assert near({**asked, "cols": 256}) == {"BLOCK_N": 256}  # a tie goes to the larger size
    exact = tuned_entry("softmax", {**asked, "cols": 1024}, "cpu-interpreter")
    assert (dict(exact.config), exact.distance) == ({"BLOCK_N": 256}, 0.0)
    # Every size counts: rows 16 is two doublings from 4.
    assert tuned_entry("softmax", {**asked, "rows": 16, "cols": 64},
                       "cpu-interpreter").distance == 2.0
    assert near({**asked, "dtype": "float16", "cols": 512}) == {"BLOCK_N": 8}
    # Nothing of that dtype, other fixed arguments, or nearest=False: the default.
    assert near({**asked, "dtype": "bfloat16"}, default={"BLOCK_N": 1}) == {"BLOCK_N": 1}
    assert near(asked, fixed={"X": 1}, default={}) == {}
    assert near(asked, default={}, nearest=False) == {}
    # The very size, tuned later, answers in the same process: it is looked up first.
    cached(asked, {"BLOCK_N": 64})
    assert near(asked) == {"BLOCK_N": 64}


def test_a_nearest_answer_costs_one_scan_until_the_cache_changes(monkeypatch):
    import sweep.tuned

    cached({"rows": 4, "cols": 64, "dtype": "float32"}, {"BLOCK_N": 32})
    scans = []
    real = sweep.tuned.of_group
    monkeypatch.setattr(sweep.tuned, "of_group", lambda *a: scans.append(a) or real(*a))
    asked = {"rows": 4, "cols": 512, "dtype": "float32"}
    for _ in range(3):  # launch after launch
        assert tuned_config("softmax", asked, device="cpu-interpreter") == {"BLOCK_N": 32}
    assert tuned_config("softmax", {**asked, "dtype": "float16"}, default={},
                        device="cpu-interpreter") == {}
    assert tuned_config("softmax", {**asked, "dtype": "float16"}, default={},
                        device="cpu-interpreter") == {}
    assert len(scans) == 2  # one for each size asked, none had a neighbour or not
    # A nearer size tuned meanwhile (another process's sweep) answers from then on.
    cached({"rows": 4, "cols": 1024, "dtype": "float32"}, {"BLOCK_N": 256})
    assert tuned_config("softmax", asked, device="cpu-interpreter") == {"BLOCK_N": 256}
    assert len(scans) == 3


def test_a_partial_entry_answers_a_nearby_size_only_when_asked():
    cached({"rows": 4, "cols": 64, "dtype": "float32"}, {"BLOCK_N": 32}, partial=True)
    asked = {"rows": 4, "cols": 128, "dtype": "float32"}
    assert tuned_config("softmax", asked, default={}, device="cpu-interpreter") == {}
    assert tuned_config("softmax", asked, default={}, device="cpu-interpreter",
                        partial=True) == {"BLOCK_N": 32}


def test_sweep_best_prints_json_and_a_triton_config_equal_to_the_runs_best(
        tmp_path, capsys):
    spec = simulate_spec(tmp_path / "s.yaml", space={"BLOCK": [16, 32, 64],
                                                     "num_warps": [2, 4, 8]})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 0
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    capsys.readouterr()
    assert sweep_cli("best", tmp_path / "run") == 0
    shown, line = capsys.readouterr().out.splitlines()
    assert json.loads(shown)["config"] == best["config"]
    config = eval(line, {"triton": triton})  # the line a user pastes
    expected = triton_config(best["config"])
    assert (config.kwargs, config.num_warps) == (expected.kwargs, expected.num_warps) == \
        ({"BLOCK": best["config"]["BLOCK"]}, best["config"]["num_warps"])
    assert sweep_cli("best", tmp_path / "run", "--json") == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["index"] == best["index"] and listed["partial"] is False
    assert sweep_cli("best", tmp_path / "nothing") == 2
    assert "no such run directory or spec file" in capsys.readouterr().err


@pytest.mark.parametrize("partial", [False, True])
def test_tuned_config_takes_a_partial_entry_only_when_asked(tmp_path, partial):
    spec = softmax_spec(tmp_path / "spec.yaml")
    problem = {"rows": 4, "cols": 64, "dtype": "float32"}
    args = ["--cache-partial", "--max-trials", "2"] if partial else []
    assert sweep_cli("run", spec, "--out", tmp_path / "a", *args) == 0
    found = tuned_config("softmax", problem, default={}, device="cpu-interpreter")
    assert bool(found) is not partial
    assert tuned_config("softmax", problem, default={}, device="cpu-interpreter",
                        partial=True) != {}


def test_another_sweep_of_the_same_kernel_and_problem_is_tuned_not_answered(
        tmp_path, capsys):
    spec = softmax_spec(tmp_path / "spec.yaml")
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    # More configs than the cached sweep tried: the cache cannot know their latencies.
    wider = write_spec(tmp_path / "wider.yaml", **{
        **yaml.safe_load(spec.read_text()),
        "space": {"BLOCK_N": [16, 32, 64], "ROWS_PER_PROGRAM": [1], "num_warps": [1, 2]}})
    capsys.readouterr()
    assert sweep_cli("run", wider, "--out", tmp_path / "b") == 0
    assert "cached" not in capsys.readouterr().out
    assert (tmp_path / "b" / "trials.parquet").exists()
    # Both sweeps are now on record: either is answered.
    for again in (spec, wider):
        assert api.run(again, out=tmp_path / "c", quiet=True).state == "cached"


def test_a_best_without_validation_is_not_cached(tmp_path, capsys):
    spec = simulate_spec(tmp_path / "s.yaml", space=SPACE, validation="off")
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    assert "validation is off" in capsys.readouterr().err
    assert lookup("matmul", "", {}) == []


def test_the_interpreter_keeps_launch_options_it_was_not_asked_to_choose(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", **{
        **yaml.safe_load(softmax_spec(tmp_path / "base.yaml").read_text()),
        "space": {"BLOCK_N": [32, 64], "ROWS_PER_PROGRAM": [1], "num_warps": [2],
                  "num_stages": [1, 2]}})
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    best = json.loads((tmp_path / "a" / "best.json").read_text())["config"]
    (entry,) = lookup("softmax", entry_source(), PROBLEM)
    # num_warps was given (one value): kept; num_stages was a pick among two: noise.
    assert dict(entry.config) == {k: v for k, v in best.items() if k != "num_stages"}
    assert entry.config["num_warps"] == 2


def test_the_interpreter_lists_finalists_that_are_different_programs_and_re_times_none(
        tmp_path, capsys):
    # Launch options change nothing there: BLOCK_N 32 with 1 or 2 stages is one program.
    # Its timings say nothing of a GPU's: re-timing took longer than the sweep itself.
    spec = write_spec(tmp_path / "spec.yaml", **{
        **yaml.safe_load(softmax_spec(tmp_path / "base.yaml").read_text()),
        "space": {"BLOCK_N": [32, 64], "ROWS_PER_PROGRAM": [1], "num_warps": [2],
                  "num_stages": [1, 2]},
        "run": {"backend": "interpret", "finalists": 5, "finalist_rounds": 1}})
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    best = json.loads((tmp_path / "a" / "best.json").read_text())
    finalists = best["finalists"]
    assert sorted(f["config"]["BLOCK_N"] for f in finalists) == [32, 64]
    assert all(f["retimed"] is False for f in finalists)
    assert best["index"] == finalists[0]["index"]  # the one pass's fastest
    assert "re-timing" not in capsys.readouterr().err
    # Answered from the cache, the result still names the finalists that chose its best.
    cached = api.run(spec, out=tmp_path / "c", quiet=True)
    assert cached.state == "cached" and cached.finalists == finalists
    assert cached.best.index == best["index"]
    one = write_spec(tmp_path / "one.yaml", **{
        **yaml.safe_load(spec.read_text()), "space": {
            "BLOCK_N": [64], "ROWS_PER_PROGRAM": [1], "num_warps": [1, 2, 4]}})
    assert sweep_cli("run", one, "--out", tmp_path / "b") == 0
    assert json.loads((tmp_path / "b" / "best.json").read_text())["finalists"] == []
    assert "re-timing" not in capsys.readouterr().err


def test_tuned_config_finds_a_kernel_with_fixed_arguments_by_the_specs_values(
        tmp_path, monkeypatch, capsys):
    # The user's module, in the directory the sweep runs from (where workers find it too).
    shutil.copy(Path(__file__).parent / "third_party_kernel.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path / "spec.yaml", name="bias", kernel="third_party_kernel:KERNEL",
                      problem={"rows": 6, "cols": 50}, fixed={"HAS_BIAS": True},
                      space={"BLOCK_N": [64, 128], "ROWS": [1, 2]},
                      timing={"warmup_ms": 1, "rep_ms": 3, "screen": "off"},
                      run={"backend": "interpret", "finalists": 0})
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    best = json.loads((tmp_path / "a" / "best.json").read_text())["config"]
    kernel, problem = "third_party_kernel:KERNEL", {"rows": 6, "cols": 50}
    assert tuned_config(kernel, problem, fixed={"HAS_BIAS": True}, default={},
                        device="cpu-interpreter") == best
    # Another fixed value is another kernel: not tuned.
    assert tuned_config(kernel, problem, fixed={"HAS_BIAS": False}, default={"x": 1},
                        device="cpu-interpreter") == {"x": 1}
    # sweep best finds it by the same key (the kernel record has fixed values of its own).
    capsys.readouterr()
    assert sweep_cli("best", spec) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["config"] == best


def test_a_gpu_entry_answers_only_a_gpu_of_exactly_its_name():
    sxm = CacheEntry(kernel="k", kernel_source="s", problem={}, backend="cuda",
                     device="NVIDIA H100 80GB HBM3", config={"B": 1}, latency_ms=1.0,
                     fingerprint="f", run_dir="/r", partial=False, written_at=0.0)
    pcie = replace(sxm, device="NVIDIA H100 PCIe", config={"B": 2})
    v = dict(sxm.versions)
    # Ray calls both H100; only the names torch reports tell them apart.
    assert answering([sxm], [("NVIDIA H100 PCIe", v)]) == []
    assert answering([sxm, pcie], [("NVIDIA H100 PCIe", v)]) == [pcie]
    assert answering([sxm, pcie], [("NVIDIA H100 80GB HBM3", v), ("NVIDIA H100 PCIe", v)]) \
        == [sxm, pcie]
    assert answering([sxm], [("NVIDIA H100 80GB HBM3", v), ("NVIDIA H100 PCIe", v)]) == []
    assert answering([sxm], []) == []
    # The GPU node's torch and Triton decide, not the head's.
    gpu_builds = {"torch": "2.11.0+cu128", "triton": "3.6.0"}
    built = replace(sxm, versions=gpu_builds)
    assert answering([built], [("NVIDIA H100 80GB HBM3", gpu_builds)]) == [built]
    assert answering([built], [("NVIDIA H100 80GB HBM3", {"torch": "2.11.0+cpu",
                                                          "triton": "3.6.0"})]) == []


@pytest.mark.slow  # a task on the session's Ray
def test_naming_the_gpus_gives_up_when_none_answers(ray_local):
    from sweep.engines.ray import placement as cluster

    # This cluster has no GPU: the task cannot start, and the check must not hang.
    assert cluster.gpu_names([""], timeout_s=1) is None
    assert cluster.gpu_names(["H100"], timeout_s=1) is None
    # A stop meanwhile ends the wait at once (well before the minute it would wait).
    started = time.monotonic()
    assert cluster.gpu_names([""], lambda: time.monotonic() > started + 0.5) is None
    assert time.monotonic() - started < 30  # half the minute: room for a busy machine


def test_launch_code_that_saw_a_partial_entry_sees_the_complete_one_later(tmp_path):
    spec = softmax_spec(tmp_path / "spec.yaml")
    assert sweep_cli("run", spec, "--out", tmp_path / "a", "--cache-partial",
                     "--max-trials", "2") == 0
    args = ("softmax", PROBLEM)
    assert tuned_config(*args, default={}, device="cpu-interpreter") == {}  # partial only
    assert sweep_cli("resume", tmp_path / "a") == 0
    best = json.loads((tmp_path / "a" / "best.json").read_text())["config"]
    # The same process (a server that kept running): the complete entry now answers.
    assert tuned_config(*args, default={}, device="cpu-interpreter") == \
        {k: v for k, v in best.items() if k != "num_warps"}


@pytest.mark.slow  # fresh processes, several: the cached answer's rule also runs in-process
def test_a_cached_sweep_is_answered_before_ray_starts(ray_local, tmp_path, request):
    spec = softmax_spec(tmp_path / "spec.yaml")
    assert sweep_cli("run", spec, "--out", tmp_path / "a") == 0
    # Short: Ray's socket paths under it must fit in 107 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    again = sweep_proc("run", spec, "--out", tmp_path / "b",
                       env={"RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": "local"})
    assert again.returncode == 0, again.stderr
    assert "cached" in again.stdout and not (tmp_path / "b").exists()
    assert list(ray_tmp.rglob("session_*")) == []  # no Ray instance was started
    # --force: the same command tunes, on a Ray of its own.
    forced = sweep_proc("run", spec, "--out", tmp_path / "c", "--force",
                        env={"RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": "local"})
    assert forced.returncode == 0, forced.stderr
    assert list(ray_tmp.rglob("session_*")) != []


ANSWERED_WITHOUT_IMPORTS = (
    "import sys; from sweep.cli import main; code = main(['run', sys.argv[1], '--out', "
    "sys.argv[2]]); loaded = sorted({'torch', 'triton', 'mysoftmax'} & set(sys.modules)); "
    "print('loaded:', loaded, file=sys.stderr); sys.exit(code)")


def cached_run(spec: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ANSWERED_WITHOUT_IMPORTS, str(spec),
                           str(out)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


@pytest.mark.slow  # fresh processes, several: the cached answer's rule also runs in-process
def test_a_cached_answer_imports_nothing_and_an_edited_or_other_kernel_file_is_no_answer(
        tmp_path):
    """A user's kernel module (a copy of the built-in softmax) in two checkouts: the
    cache answers the same spec in the same checkout from files alone; after an edit, or
    in the other checkout, it is no answer (the sweep runs)."""
    source = (ROOT / "sweep_kernels" / "softmax.py").read_text()
    first, other = tmp_path / "first", tmp_path / "other"
    for where in (first, other):
        where.mkdir()
        (where / "mysoftmax.py").write_text(source)
        spec = softmax_spec(where / "spec.yaml")
        spec.write_text(spec.read_text().replace("kernel: softmax", "kernel: mysoftmax:KERNEL"))
    (other / "mysoftmax.py").write_text(source + "\n# another checkout's copy\n")
    done = cached_run(first / "spec.yaml", first / "run-1", first)
    assert done.returncode == 0 and (first / "run-1" / "trials.parquet").exists(), done.stderr

    done = cached_run(first / "spec.yaml", first / "run-2", first)
    assert done.returncode == 0, done.stderr
    assert "cached" in done.stdout and not (first / "run-2").exists()
    assert "loaded: []" in done.stderr  # neither torch, Triton nor the kernel imported

    done = cached_run(other / "spec.yaml", other / "run-1", other)
    assert done.returncode == 0 and (other / "run-1" / "trials.parquet").exists(), \
        (done.stdout, done.stderr)

    (first / "mysoftmax.py").write_text(source + "\n# edited\n")
    done = cached_run(first / "spec.yaml", first / "run-3", first)
    assert done.returncode == 0 and (first / "run-3" / "trials.parquet").exists(), \
        (done.stdout, done.stderr)
