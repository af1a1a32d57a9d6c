"""The cuda backend on a real GPU: compile pool, sticky CUDA errors, shared-memory limits.
Skipped where no GPU is visible (CI); run on the GPU machine (see BENCHMARKS.md)."""

import json

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, sweep_proc, write_spec

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_quickstart_compiles_ahead_and_records_compile_errors_on_the_gpu(tmp_path):
    out = tmp_path / "qs"
    result = sweep_proc("run", ROOT / "configs" / "quickstart.yaml", "--out", out,
                        "--backend", "cuda", timeout=600)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    for r in rows:
        expected = "compile_error" if r["BLOCK_K"] == 48 else "ok"
        assert r["status"] == expected, r
        assert "H" in r["device"] or "NVIDIA" in r["device"]
        if r["status"] == "ok":
            assert r["validation"] == "passed" and r["compile_ms"] > 0


def test_an_illegal_memory_access_is_recorded_crashed_and_the_sweep_completes(tmp_path):
    out = tmp_path / "faults"
    result = sweep_proc("run", ROOT / "configs" / "faults-gpu.yaml", "--out", out,
                        timeout=600)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    got = {(r["BLOCK"], r["MODE"]): r for r in rows}
    assert len(rows) == 9
    for (block, mode), r in got.items():
        if block == 48:
            assert r["status"] == "compile_error", r
        elif mode == 3:
            assert r["status"] == "crashed", r
            assert "illegal memory access" in r["error"], r["error"]
        elif mode == 1:
            assert (r["status"], r["validation"]) == ("incorrect", "failed"), r
        else:
            assert (r["status"], r["validation"]) == ("ok", "passed"), r
    best = json.loads((out / "best.json").read_text())
    assert best["config"]["MODE"] == 0 and best["partial"] is False
    # Only the launching process was replaced: no worker was, so no worker name is new.
    assert len({r["worker"] for r in rows}) <= torch.cuda.device_count()


def test_configs_beyond_shared_memory_are_compile_errors_not_crashes(tmp_path):
    spec = write_spec(tmp_path / "smem.yaml", kernel="matmul",
                      problem={"M": 1024, "N": 1024, "K": 1024, "dtype": "float16"},
                      space={"BLOCK_M": [64, 256], "BLOCK_N": [64, 256], "BLOCK_K": [32, 256],
                             "GROUP_M": [8], "num_warps": [4], "num_stages": [2, 6]},
                      timing={"warmup_ms": 5, "rep_ms": 20},
                      # the largest tile's compile outlasts 10x its peers' median on an
                      # H200: a learnt limit would stop it before its resources are known
                      run={"backend": "cuda", "compile_timeout_s": "off"})
    result = sweep_proc("run", spec, "--out", tmp_path / "run", timeout=600)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    by_config = {(r["BLOCK_M"], r["BLOCK_N"], r["BLOCK_K"], r["num_stages"]): r for r in rows}
    huge = by_config[(256, 256, 256, 6)]  # about 1.5 MB of shared memory
    assert huge["status"] == "compile_error" and "resource" in huge["error"].lower(), huge
    assert by_config[(64, 64, 32, 2)]["status"] == "ok"
    assert {r["status"] for r in rows} <= {"ok", "compile_error"}


def test_a_complete_gpu_run_answers_the_next_run_and_the_launch_code(tmp_path):
    import subprocess
    import sys

    spec = ROOT / "configs" / "quickstart.yaml"
    first = sweep_proc("run", spec, "--out", tmp_path / "a", timeout=600)
    assert first.returncode == 0, first.stderr
    best = json.loads((tmp_path / "a" / "best.json").read_text())
    assert "NVIDIA" in best["device"]  # backend auto found the GPU
    # torch's matmul (cuBLAS) was timed on the same GPU, among the finalists
    torch = best["baseline"][best["device"]]
    assert torch["of"] == "baseline" and 0 < torch["latency_p20_ms"] <= torch["latency_ms"]
    # The same sweep again: a task on the GPU names it, and the cache answers.
    again = sweep_proc("run", spec, "--out", tmp_path / "b", timeout=600)
    assert again.returncode == 0, again.stderr
    assert "cached" in again.stdout and not (tmp_path / "b").exists(), again.stdout
    code = ("import json; from sweep.tuned import tuned_config, tuned_entry; "
            "p = {'M': 128, 'N': 128, 'K': 128, 'dtype': 'float16'}; "
            "print(json.dumps([tuned_config('matmul', p, default={}), "
            "tuned_entry('matmul', p).device]))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == [best["config"], best["device"]]


def test_the_pools_binary_is_the_one_the_launch_loads(tmp_path):
    # The pool's processes compile with stand-ins for the arguments and no CUDA set up
    # (actors/compile_target.py): what they put in Triton's cache must be what a launch on
    # real tensors looks up, or every config would compile twice.
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import json, os, sys, torch
        from actors.compile_pool import CompileJob, CompilePool
        from actors.protocol import CompileLimit
        from sweep_kernels import load_kernel
        problem = {"M": 512, "N": 512, "K": 512, "dtype": "float16"}
        config = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8,
                  "num_warps": 4, "num_stages": 3}
        pool = CompilePool(1, CompileJob("matmul", problem), CompileLimit(300.0))
        pool.submit(0, config)
        while (got := pool.take([0])) is None:
            pool.wait(0.1)
        pool.close()
        cache = os.environ["TRITON_CACHE_DIR"]
        before = sorted(os.listdir(cache))
        kernel = load_kernel("matmul")
        full = {**kernel.problem_defaults, **problem}
        inputs = kernel.make_inputs(full, "cuda", 0)
        args, out, passed = kernel.arguments(inputs, full)
        keywords = {**kernel.fixed, **config}
        compiled = kernel.function(full)[kernel.grid(full, keywords)](*args, **passed, **keywords)
        torch.cuda.synchronize()
        right = torch.allclose(out.float(), kernel.reference(inputs, full).float(),
                               rtol=1e-2, atol=1e-2)
        print(json.dumps({"ok": got[1].ok, "error": got[1].error, "right": bool(right),
                          "new": sorted(set(os.listdir(cache)) - set(before)),
                          "same": got[1].binary == compiled.hash}))
    """)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["right"] and got["same"], got
    # Any new entry would be a binary of the launch's own (a launcher stub is not one).
    assert not [d for d in got["new"]
                if any(f.endswith(".cubin") for f in os.listdir(tmp_path / "cache" / d))], got


def test_a_screen_of_a_steady_kernel_ends_early_near_the_careful_median():
    from actors.timing import time_cuda

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for _ in range(3):  # cuBLAS's set-up is no repetition's time
        a @ a
    torch.cuda.synchronize()
    launches: list[int] = []

    def matmul() -> None:
        launches.append(1)
        a @ a

    # a budget of MAX_SAMPLES repetitions however long one takes
    careful = time_cuda(matmul, 5.0, 10_000.0)
    careful_launches = len(launches)
    launches.clear()
    screen = time_cuda(matmul, 5.0, 10_000.0, screen=True)
    assert len(launches) < careful_launches / 2, (len(launches), careful_launches)
    assert abs(screen.median_ms / careful.median_ms - 1) < 0.15, (screen, careful)


def test_a_gpu_run_launches_and_forks_from_the_spares_its_command_began(tmp_path):
    trace = tmp_path / "trace.jsonl"
    result = sweep_proc("run", ROOT / "configs" / "quickstart.yaml", "--out", tmp_path / "r",
                        "--backend", "cuda", timeout=600, env={"SWEEP_TRACE": str(trace)})
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    ahead = {e["pid"] for e in events if e["event"] == "spare_started"}
    launchers = {e["pid"] for e in events if e["event"] == "launcher_started"}
    forks = {e["pid"] for e in events if e["event"] == "fork_server_prepared"}
    # Every launcher and fork server was a spare: none started afresh beside them.
    assert launchers and forks and launchers | forks <= ahead, (ahead, launchers, forks)
