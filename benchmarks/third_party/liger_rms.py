"""Liger-Kernel 0.8.5's block RMSNorm forward (`_block_rms_norm_forward_kernel`) as a sweep
kernel: `kernel: liger_rms:KERNEL`, run from this folder.

The kernel normalises BLOCK_ROW rows per program, each row in one BLOCK_SIZE tile, so a
BLOCK_SIZE below n_cols leaves columns unwritten (those configs come out `incorrect`).
It writes Y and RSTD (float32 in Liger's "llama" casting mode, its default); both are
validated.

Under Triton's CPU interpreter this kernel cannot run as it ships: it takes `rsqrt` from
libdevice, which the interpreter turns into None. benchmarks/third_party/check_cpu.py runs
it there with that one name swapped for tl.rsqrt, to check this wrapper (argument order,
strides, grid); the sweep itself is for the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
from liger_kernel.ops.rms_norm import _block_rms_norm_forward_kernel, _rms_norm_forward_kernel
from liger_kernel.ops.utils import calculate_settings

from sweep_kernels import Config, Kernel, Problem

EPS = 1e-6  # LigerRMSNorm's default
OFFSET = 0.0  # Llama's (Gemma uses 1.0)
LLAMA = 0  # casting_mode: Liger's _CASTING_MODE_LLAMA, LigerRMSNorm's default


def make_inputs(problem: Problem, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, problem["dtype"])
    x = torch.randn(problem["n_rows"], problem["n_cols"], generator=gen, device=device)
    w = 1 + 0.1 * torch.randn(problem["n_cols"], generator=gen, device=device)
    return x.to(dtype), w.to(dtype)


def outputs_for(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Y, and RSTD in float32 (casting modes llama and gemma; mode none would be x's)."""
    return torch.empty_like(x), torch.empty(x.shape[0], dtype=torch.float32, device=x.device)


def launch_args(inputs: tuple[torch.Tensor, ...], problem: Problem):
    x, w = inputs
    y, rstd = outputs_for(x)
    n_rows, n_cols = x.shape
    # Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, W_row_stride, RSTD_ptr,
    # RSTD_row_stride, n_rows, n_cols, eps, offset; the constexprs go by keyword.
    return (y, y.stride(0), x, x.stride(0), w, w.stride(0), rstd, rstd.stride(0),
            n_rows, n_cols, EPS, OFFSET), (y, rstd)


def reference(inputs: tuple[torch.Tensor, ...], problem: Problem):
    """Llama casting: the statistics in float32, the product with the weight in x's dtype."""
    x, w = inputs
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=1) + EPS)
    y = (xf * rstd[:, None]).to(x.dtype) * (OFFSET + w)
    return y, rstd


def baseline(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    x, w = inputs
    return torch.nn.functional.rms_norm(x, (x.shape[1],), w, EPS)


def grid(problem: Problem, config: Config) -> tuple[int, ...]:
    return (triton.cdiv(problem["n_rows"], config["BLOCK_ROW"]),)


def _bytes(problem: Problem) -> float:
    size = torch.finfo(getattr(torch, problem["dtype"])).bits // 8
    rows, cols = problem["n_rows"], problem["n_cols"]
    return 2.0 * rows * cols * size + cols * size + 4.0 * rows  # x in, y out, w, rstd


KERNEL = Kernel(
    name="liger-block-rmsnorm",
    fn=_block_rms_norm_forward_kernel,
    problem_defaults={"n_rows": 65536, "n_cols": 4096, "dtype": "bfloat16"},
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    launch_args=launch_args,
    grid=grid,
    bytes_moved=_bytes,
    fixed={"casting_mode": LLAMA, "elementwise_affine": True},
)


def liger_block_config(problem: Problem) -> dict[str, Any]:
    """This kernel at the settings Liger gives it when it launches it: calculate_settings'
    BLOCK_SIZE and num_warps, BLOCK_ROW 16 (the comparison made
    when the issue was filed)."""
    block, warps = calculate_settings(problem["n_cols"])
    return {"BLOCK_SIZE": block, "BLOCK_ROW": 16, "num_warps": warps}


def liger_uses_block_kernel(problem: Problem) -> bool:
    """Liger's own dispatch (rms_norm_forward, row_mode None): the block kernel only for
    BLOCK_SIZE <= 256 and at least 32768 rows; otherwise one program per row."""
    block, _ = calculate_settings(problem["n_cols"])
    return not (block > 256 or problem["n_rows"] < 4096 * 8)


# name -> (launch, its config, what it filled): the package's own launches, for
# benchmarks/third_party.py to validate and time against a sweep's pick.
Launches = dict[str, tuple[Callable[[], None], dict[str, Any], Callable[[], tuple[Any, ...]]]]


def package_launches(inputs: tuple[torch.Tensor, ...], problem: Problem) -> Launches:
    """What Liger itself launches for this problem. `liger`: rms_norm_forward's dispatch
    mirrored on preallocated outputs (for 4096 columns that is _rms_norm_forward_kernel,
    one row per program, not this kernel); `liger_function`: rms_norm_forward itself
    (LigerRMSNorm's forward: it allocates Y and RSTD on each call); `liger_block`: this
    kernel at the settings Liger gives it."""
    from liger_kernel.ops.rms_norm import rms_norm_forward

    x, w = inputs
    n_rows, n_cols = x.shape
    block, warps = calculate_settings(n_cols)
    launches: Launches = {}
    if liger_uses_block_kernel(problem):
        launches["liger"] = _block_launch(inputs, problem, liger_block_config(problem))
    else:
        y, rstd = outputs_for(x)

        def row() -> None:
            _rms_norm_forward_kernel[(n_rows,)](
                y, y.stride(0), x, x.stride(0), w, w.stride(0), rstd, rstd.stride(0),
                n_cols, EPS, OFFSET, LLAMA, elementwise_affine=True, BLOCK_SIZE=block,
                num_warps=warps)

        launches["liger"] = (row, {"kernel": "_rms_norm_forward_kernel", "BLOCK_SIZE": block,
                                   "num_warps": warps}, lambda: (y, rstd))
    last: list[Any] = []

    def function() -> None:
        result = rms_norm_forward(x, w, EPS, OFFSET, "llama", None)  # Y, X, RSTD, ...
        last[:] = result[0], result[2]

    launches["liger_function"] = (function, {"kernel": "rms_norm_forward"}, lambda: tuple(last))
    launches["liger_block"] = _block_launch(inputs, problem, liger_block_config(problem))
    return launches


def _block_launch(inputs: tuple[torch.Tensor, ...], problem: Problem, config: Config
                  ) -> tuple[Callable[[], None], dict[str, Any], Callable[[], tuple[Any, ...]]]:
    args, out = launch_args(inputs, problem)
    keywords = {**KERNEL.fixed, **config}
    g = grid(problem, keywords)

    def launch() -> None:
        _block_rms_norm_forward_kernel[g](*args, **keywords)

    return launch, {"kernel": "_block_rms_norm_forward_kernel", **config}, lambda: out
