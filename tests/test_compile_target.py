"""A compile process compiles for the GPU without setting it up (actors/compile_target.py):
real Triton compiles for an H200's target on this machine, which has no GPU at all, each in
a process of its own (the stand-in driver is Triton's global)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

SPEC = {"kernel": "matmul", "kernel_path": "", "seed": 0, "fixed": {}, "problem_keys": [],
        "problem": {"M": 256, "N": 256, "K": 256, "dtype": "float16"}}
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
          "num_stages": 3}


def in_a_process(code: str, cache: Path, setup: str = "", env: dict | None = None) -> dict:
    """Run code as a compile process runs: NVML's answer replaced by an H200's (90, 32)."""
    script = textwrap.dedent("""
        import json, sys
        from actors import compile_process, compile_target
        compile_target.gpu_target = lambda: (90, 32)
        spec = json.loads(sys.argv[1])
        config = json.loads(sys.argv[2])
    """) + textwrap.dedent(setup) + textwrap.dedent(code)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": "",
           **(env or {})}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(SPEC), json.dumps(CONFIG)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_config_compiles_for_the_gpus_target_with_no_cuda_set_up(tmp_path):
    got = in_a_process("""
        import torch
        compiler = compile_process._Compiler(spec, *compile_process._set_up(spec))
        compiler.compile(config)
        print(json.dumps({"stand_ins": compiler.arguments is compile_target.stand_ins,
                          "checked": compiler.checked, "cuda": torch.cuda.is_initialized()}))
    """, tmp_path / "cache")
    # Checked: real tensors reach the binary the stand-ins compiled.
    assert got == {"stand_ins": True, "checked": True, "cuda": False}
    # The binary is in Triton's on-disk cache, where the worker's launch looks for it,
    # compiled for the H200's architecture.
    [cubin] = (tmp_path / "cache").rglob("matmul_kernel.cubin")
    meta = json.loads(cubin.with_suffix(".json").read_text())
    assert meta["target"]["arch"] == 90


def test_a_configs_own_compile_error_is_its_and_the_stand_ins_stay(tmp_path):
    got = in_a_process("""
        compiler = compile_process._Compiler(spec, *compile_process._set_up(spec))
        try:
            compiler.compile({**config, "BLOCK_K": 48})  # tl.arange needs a power of 2
            error = None
        except Exception as e:
            error = type(e).__name__
        print(json.dumps({"error": error,
                          "stand_ins": compiler.arguments is compile_target.stand_ins}))
    """, tmp_path / "cache")
    assert got == {"error": "CompilationError", "stand_ins": True}


def test_once_proved_a_configs_own_error_keeps_the_stand_ins(tmp_path):
    got = in_a_process("""
        compiler = compile_process._Compiler(spec, *compile_process._set_up(spec))
        compiler.compile(config)  # proves the stand-ins
        try:
            compiler.compile({**config, "num_warps": 3})  # Triton asserts a power of 2
            error = None
        except Exception as e:
            error = type(e).__name__
        print(json.dumps({"error": error, "checked": compiler.checked,
                          "stand_ins": compiler.arguments is compile_target.stand_ins}))
    """, tmp_path / "cache")
    assert got == {"error": "AssertionError", "checked": True, "stand_ins": True}


def test_a_stand_in_has_the_tensors_shape_strides_and_alignment():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from actors.compile_target import StandIn

    with FakeTensorMode():
        x = torch.empty(64, 48, dtype=torch.float16)
        aligned, view = StandIn(x), StandIn(x[:, 3:])
    # A heuristic reads the shape; Triton reads the pointer's alignment to 16 bytes.
    assert (aligned.shape, aligned.stride(), aligned.dtype) == ((64, 48), (48, 1), torch.float16)
    assert aligned.data_ptr() % 16 == 0 and view.data_ptr() % 16 != 0


def test_a_process_that_cannot_make_real_arguments_gives_up_its_set_up(tmp_path):
    got = in_a_process("""
        compiler = compile_process._Compiler(spec, *compile_process._set_up(spec))
        try:
            compiler.compile(config)
            lost = None
        except compile_process.SetUpLost as e:
            lost = str(e)
        print(json.dumps({"lost": lost}))
    """, tmp_path / "cache", setup="""
        compile_process._Compiler._reaches = lambda *args: False
        def refused(kernel, problem, seed):
            raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")
        compile_process._arguments = refused
    """)
    # Not the config's error: the pool gives the config to another process.
    assert got == {"lost": "RuntimeError: Cannot re-initialize CUDA in forked subprocess"}


def test_stand_ins_that_miss_the_launchs_binary_give_way_to_real_arguments(tmp_path):
    got = in_a_process("""
        compiler = compile_process._Compiler(spec, *compile_process._set_up(spec))
        try:
            compiler.compile(config)
        except ValueError:
            pass  # the stand-in "real" arguments are no launch's
        from triton.runtime import driver
        print(json.dumps({"real": compiler.arguments is compile_process._arguments,
                          "args": compiler._args(compiler.problem),
                          "driver": type(driver._active).__name__}))
    """, tmp_path / "cache", setup="""
        compile_process._Compiler._reaches = lambda *args: False
        compile_process._arguments = lambda kernel, problem, seed: "real"
    """)
    assert got == {"real": True, "args": "real", "driver": "NoneType"}


def test_a_make_inputs_fake_tensors_cannot_run_gets_real_arguments(tmp_path):
    got = in_a_process("""
        kernel, problem, args, fixed, arguments = compile_process._set_up(spec)
        from triton.runtime import driver
        print(json.dumps({"args": args, "real": arguments is compile_process._arguments,
                          "driver": type(driver._active).__name__}))
    """, tmp_path / "cache", setup="""
        import dataclasses
        from sweep_kernels import matmul
        def data_dependent(problem, device, seed):
            import torch
            return (torch.ones(2).sum().item(),)  # a value fake tensors do not have
        matmul.KERNEL = dataclasses.replace(matmul.KERNEL, make_inputs=data_dependent)
        compile_process._arguments = lambda kernel, problem, seed: "real"
    """)
    # ...and Triton's own driver back, so what it compiles it compiles as the launch will.
    assert got["args"] == "real" and got["real"] and got["driver"] == "NoneType"


def test_without_a_usable_nvml_the_target_is_unknown(monkeypatch):
    # The processes then set up CUDA as before: no library, or one missing a symbol.
    import ctypes

    from actors import compile_target

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(compile_target.ctypes, "CDLL", missing)
    assert compile_target.gpu_target.__wrapped__() is None
    monkeypatch.setattr(compile_target.ctypes, "CDLL", lambda name: ctypes.CDLL(None))
    assert compile_target.gpu_target.__wrapped__() is None  # libc: no nvmlInit_v2


def test_sweep_stand_ins_0_turns_them_off(tmp_path):
    got = in_a_process("""
        kernel, problem, args, fixed, arguments = compile_process._set_up(spec)
        print(json.dumps({"args": args, "real": arguments is compile_process._arguments}))
    """, tmp_path / "cache", setup="""
        compile_process._arguments = lambda kernel, problem, seed: "real"
    """, env={"SWEEP_STAND_INS": "0"})
    assert got == {"args": "real", "real": True}


def test_a_pool_told_its_binary_was_missed_starts_processes_on_real_arguments(tmp_path):
    got = in_a_process("""
        kernel, problem, args, fixed, arguments = compile_process._set_up(
            {**spec, "stand_ins": False})
        print(json.dumps({"args": args, "real": arguments is compile_process._arguments}))
    """, tmp_path / "cache", setup="""
        compile_process._arguments = lambda kernel, problem, seed: "real"
    """)
    assert got == {"args": "real", "real": True}


def test_stand_ins_are_made_without_importing_torchs_compiler_stack(tmp_path):
    # FakeTensorMode, or most meta-device arithmetic, imports torch._dynamo and sympy:
    # seconds on a GPU host, before the first compile of every process.
    got = in_a_process("""
        made = {}
        for name in ("matmul", "softmax"):
            kernel, problem, args, fixed, arguments = compile_process._set_up(
                {**spec, "kernel": name, "problem": {}})
            made[name] = arguments is compile_target.stand_ins
        heavy = sorted(m for m in ("torch._dynamo", "sympy")
                       if m in sys.modules)
        print(json.dumps({"stand_ins": made, "imported": heavy}))
    """, tmp_path / "cache")
    assert got == {"stand_ins": {"matmul": True, "softmax": True}, "imported": []}


def test_a_compile_says_the_binary_a_launch_of_its_geometry_loads(tmp_path):
    got = in_a_process("""
        compiler = compile_process._Compiler(spec, *compile_process._set_up(spec))
        binary = compiler.compile(config)
        real = compile_process._compile(
            compiler.kernel, compiler.problem, compile_target.real_twins(compiler.made[
                next(iter(compiler.made))]), {**compiler.fixed, **config})
        print(json.dumps({"binary": binary, "launched": real.hash}))
    """, tmp_path / "cache")
    assert isinstance(got["binary"], str) and got["binary"] == got["launched"]


def test_the_fork_server_hashes_triton_once_for_every_process_it_forks(tmp_path):
    # Before a process's first compile, a cache hit too, Triton hashes its own sources
    # and library: done in the server, beside its imports, each fork has it already.
    got = in_a_process("""
        compile_process.prepare(json.dumps(spec))
        import threading
        from triton.runtime import cache
        print(json.dumps({"keyed": cache.triton_key.cache_info().currsize,
                          "threads": threading.active_count()}))
    """, tmp_path / "cache")
    assert got == {"keyed": 1, "threads": 1}  # and no thread left to run across a fork
