"""Check the third-party wrappers on a machine without a GPU, under Triton's interpreter.

For each kernel module of this folder: make_inputs, launch_args, reference, grid (and the
torch baseline against the reference) on tiny float32/float16 problems; then the kernel
itself launched through the wrapper, and the package's own launches, each output checked
against the reference. Liger's kernels cannot run in the interpreter as they ship (their
`rsqrt` is libdevice's, which the interpreter makes None, and they call `.to` on the
float eps, which the interpreter passes as a Python float), so for them, here only,
`rsqrt` is swapped for tl.rsqrt and the wrapper's EPS/OFFSET for floats with a `.to`:
what is checked is the wrapper's argument order, strides and grid, not Liger's numerics.
fla's chunk_fwd_kernel_o runs as it ships.

Usage (from the repository root, with the packages importable, e.g. from wheels
installed into /tmp/site): PYTHONPATH=/tmp/site python benchmarks/third_party/check_cpu.py
Prints one line per check and exits 1 if any failed.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported, by anything

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import TensorHandle  # noqa: E402

failures: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


class InterpretedFloat(float):
    """A float for the interpreter, which passes Python floats through as they are: Liger's
    kernels call `eps.to(tl.float32)`, as compiled Triton allows on a scalar argument."""

    def to(self, dtype: Any) -> tl.tensor:
        np_dtype = {"fp32": np.float32, "fp16": np.float16, "fp64": np.float64}[dtype.name]
        return tl.tensor(TensorHandle(np.array([float(self)], dtype=np_dtype), dtype), dtype)


def errors(got: Any, expected: Any) -> list[float]:
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    if len(got) != len(expected):
        return [float("inf")]
    return [(a.float() - b.float()).abs().max().item() for a, b in zip(got, expected)]


def close(got: Any, expected: Any, rtol: float, atol: float) -> bool:
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    return len(got) == len(expected) and all(
        a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol)
        for a, b in zip(got, expected))


def launch_config(module: Any, problem: dict, config: dict, fixed: dict | None = None,
                  seed: int = 0) -> tuple[Any, Any]:
    """The kernel through the wrapper, as the sweep launches it: outputs NaN first."""
    kernel = module.KERNEL
    inputs = kernel.make_inputs(problem, "cpu", seed)
    args, out = kernel.launch_args(inputs, problem)
    for t in out if isinstance(out, tuple) else (out,):
        t.fill_(float("nan"))
    keywords = {**kernel.fixed, **(fixed or {}), **config}
    kernel.fn[kernel.grid(problem, keywords)](*args, **keywords)
    return out, kernel.reference(inputs, problem)


def package(module: Any, problem: dict, rtol: float, atol: float) -> None:
    inputs = module.KERNEL.make_inputs(problem, "cpu", 1)
    expected = module.KERNEL.reference(inputs, problem)
    for name, (launch, config, filled) in module.package_launches(inputs, problem).items():
        launch()
        got = filled()
        check(f"{module.__name__} {name} {config}", close(got, expected, rtol, atol),
              f"max abs errors {errors(got, expected)}")


def _describe(arg: Any) -> str:
    if isinstance(arg, torch.Tensor):
        return f"tensor{tuple(arg.shape)}"
    return repr(arg)


def host_side(module: Any, problem: dict, config: dict, rtol: float, atol: float,
              baseline_of: Callable[[Any], Any] | None = None) -> None:
    kernel = module.KERNEL
    inputs = kernel.make_inputs(problem, "cpu", 0)
    again = kernel.make_inputs(problem, "cpu", 0)
    other = kernel.make_inputs(problem, "cpu", 1)
    check(f"{module.__name__} make_inputs seeded",
          all(torch.equal(a, b) for a, b in zip(inputs, again))
          and not all(torch.equal(a, b) for a, b in zip(inputs, other)))
    dtype = getattr(torch, problem["dtype"])
    args, out = kernel.launch_args(inputs, problem)
    # The positional arguments are exactly the function's parameters that are not
    # tl.constexpr (the constexprs go by keyword: config and fixed values).
    fn = getattr(kernel.fn, "fn", kernel.fn)
    params = inspect.signature(fn).parameters.values()
    runtime = [p.name for p in params if "constexpr" not in str(p.annotation)]
    shown = ", ".join(f"{n}={_describe(a)}" for n, a in zip(runtime, args))
    check(f"{module.__name__} launch_args by position", len(args) == len(runtime), shown)
    expected = kernel.reference(inputs, problem)
    outs = out if isinstance(out, tuple) else (out,)
    refs = expected if isinstance(expected, tuple) else (expected,)
    check(f"{module.__name__} outputs match reference's shapes",
          [o.shape for o in outs] == [r.shape for r in refs],
          f"{[tuple(o.shape) for o in outs]}, {[str(o.dtype) for o in outs]}")
    check(f"{module.__name__} inputs dtype", all(t.dtype == dtype for t in inputs))
    keywords = {**kernel.fixed, **config}
    check(f"{module.__name__} grid", True, f"{kernel.grid(problem, keywords)} for {config}")
    if kernel.baseline is not None:
        base = kernel.baseline(inputs, problem)
        check(f"{module.__name__} reference against torch's own",
              close(base, refs[0], rtol, atol), f"max abs error {errors(base, refs[0])}")


def interpretable_liger() -> None:
    """In this process only: Liger's kernels made runnable by the interpreter (see the
    docstring); benchmarks/third_party.py --smoke uses it for its in-process comparison."""
    import liger_kernel.ops.layer_norm as liger_ln
    import liger_kernel.ops.rms_norm as liger_rms_ops
    import liger_layer_norm
    import liger_rms

    # Looked up when called: the interpreter puts its own tl.rsqrt in place while it runs.
    liger_rms_ops.rsqrt = liger_ln.rsqrt = lambda x: tl.rsqrt(x)
    liger_rms.EPS, liger_rms.OFFSET = InterpretedFloat(liger_rms.EPS), InterpretedFloat(0.0)
    liger_layer_norm.EPS = InterpretedFloat(liger_layer_norm.EPS)


def liger() -> None:
    import liger_layer_norm
    import liger_rms

    rms = {"n_rows": 37, "n_cols": 96, "dtype": "float32"}  # odd sizes: masks, tails
    host_side(liger_rms, rms, {"BLOCK_SIZE": 128, "BLOCK_ROW": 4}, 1e-4, 1e-4)
    ln = {"n_rows": 37, "n_cols": 96, "dtype": "float32"}
    host_side(liger_layer_norm, ln, {"BLOCK_SIZE": 128}, 1e-4, 1e-4)

    # As shipped, the interpreter cannot run them (why: this file's docstring).
    try:
        launch_config(liger_rms, rms, {"BLOCK_SIZE": 128, "BLOCK_ROW": 4})
        check("liger rms as shipped under the interpreter (expected to fail)", False)
    except Exception as e:
        check("liger rms as shipped fails under the interpreter, as expected", True,
              f"{type(e).__name__}: {str(e)[:80]}")

    interpretable_liger()
    for problem in (rms, {**rms, "dtype": "float16"}):
        tol = 1e-4 if problem["dtype"] == "float32" else 1e-2
        for config in ({"BLOCK_SIZE": 128, "BLOCK_ROW": 4}, {"BLOCK_SIZE": 128, "BLOCK_ROW": 1},
                       {"BLOCK_SIZE": 256, "BLOCK_ROW": 16}):
            got, expected = launch_config(liger_rms, problem, config)
            check(f"liger_rms {problem['dtype']} {config}", close(got, expected, tol, tol),
                  f"max abs errors {errors(got, expected)}")
        got, expected = launch_config(liger_rms, problem, {"BLOCK_SIZE": 64, "BLOCK_ROW": 4})
        check(f"liger_rms {problem['dtype']} BLOCK_SIZE 64 < n_cols is wrong, as expected",
              not close(got, expected, tol, tol))
        package(liger_rms, problem, tol, tol)
    check("liger_rms dispatch for 65536x4096 is the row kernel",
          not liger_rms.liger_uses_block_kernel({"n_rows": 65536, "n_cols": 4096}))
    check("liger_rms dispatch for 65536x256 is the block kernel",
          liger_rms.liger_uses_block_kernel({"n_rows": 65536, "n_cols": 256}))
    check("liger_rms Liger's block settings for 4096 columns",
          liger_rms.liger_block_config({"n_cols": 4096})
          == {"BLOCK_SIZE": 4096, "BLOCK_ROW": 16, "num_warps": 8})

    for problem in (ln, {**ln, "dtype": "float16"}):
        tol = 1e-4 if problem["dtype"] == "float32" else 1e-2
        for config in ({"BLOCK_SIZE": 128}, {"BLOCK_SIZE": 256}):
            got, expected = launch_config(liger_layer_norm, problem, config)
            check(f"liger_layer_norm {problem['dtype']} {config} (Y, Mean, RSTD)",
                  close(got, expected, tol, tol), f"max abs errors {errors(got, expected)}")
        got, expected = launch_config(liger_layer_norm, problem, {"BLOCK_SIZE": 64})
        check(f"liger_layer_norm {problem['dtype']} BLOCK_SIZE 64 < n_cols is wrong",
              not close(got, expected, tol, tol))
        package(liger_layer_norm, problem, tol, tol)
    check("liger_layer_norm Liger's config for 4096 columns",
          liger_layer_norm.liger_config({"n_cols": 4096}) == {"BLOCK_SIZE": 4096,
                                                               "num_warps": 8})


def fla() -> None:
    import fla_chunk_o

    # HV = 2H (value heads sharing q/k heads) and T not a multiple of BT (a tail chunk).
    problem = {"B": 2, "T": 40, "H": 1, "HV": 2, "K": 32, "V": 48, "chunk_size": 16,
               "dtype": "float32"}
    fixed = {"H": 1, "HV": 2, "K": 32, "V": 48, "BT": 16}
    check("fla_chunk_o check_fixed flags a mismatch",
          fla_chunk_o.check_fixed(problem, {**fixed, "K": 64}) == [
              "fixed K=64 but problem K=32"])
    check("fla_chunk_o check_fixed passes a match", fla_chunk_o.check_fixed(problem, fixed) == [])
    host_side(fla_chunk_o, problem, {"BK": 32, "BV": 32}, 1e-4, 1e-4)
    candidates = fla_chunk_o.fla_configs()
    check("fla_chunk_o fla's own configs", len(candidates) >= 2, f"{candidates}")
    for dtype, tol in (("float32", 2e-3), ("float16", 3e-2)):
        p = {**problem, "dtype": dtype}
        for config in [{"BK": 16, "BV": 16}, {"BK": 32, "BV": 64},
                       *({"BK": c["BK"], "BV": c["BV"]} for c in candidates)]:
            got, expected = launch_config(fla_chunk_o, p, config, fixed)
            check(f"fla_chunk_o {dtype} {config}", close(got, expected, tol, tol),
                  f"max abs error {errors(got, expected)}")
    # fla's own wrapper, chunk_fwd_o, with its autotuner held to one config (benchmarking
    # needs a GPU): the same output as the bare kernel through this wrapper.
    from fla.ops.common import chunk_o

    tuner = fla_chunk_o.DECORATED.fn
    kept = tuner.configs
    try:
        tuner.configs = kept[-1:]
        inputs = fla_chunk_o.KERNEL.make_inputs(problem, "cpu", 2)
        q, k, v, h = inputs
        theirs = chunk_o.chunk_fwd_o(q, k, v, h, scale=fla_chunk_o.scale_of(problem),
                                     chunk_size=problem["chunk_size"])
        expected = fla_chunk_o.KERNEL.reference(inputs, problem)
        check("fla chunk_fwd_o (fla's own launch) against this reference",
              close(theirs, expected, 2e-3, 2e-3), f"max abs error {errors(theirs, expected)}")
        only = kept[-1]
        got, _ = launch_config(fla_chunk_o, problem, {**only.kwargs}, fixed, seed=2)
        check(f"fla chunk_fwd_o equals the bare kernel at {only.kwargs}",
              close(got, theirs, 1e-5, 1e-5), f"max abs error {errors(got, theirs)}")
        package(fla_chunk_o, problem, 2e-3, 2e-3)  # the autotuner's pick, and chunk_fwd_o
    finally:
        tuner.configs = kept


def main() -> None:
    liger()
    fla()
    print(f"{len(failures)} failed" if failures else "all passed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
