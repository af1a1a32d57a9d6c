"""Liger-Kernel 0.8.5's LayerNorm forward (`_layer_norm_forward_kernel`) as a sweep kernel
with several outputs: `kernel: liger_layer_norm:KERNEL`, run from this folder.

One program per row; the row is one BLOCK_SIZE tile, so BLOCK_SIZE must be at least
n_cols (the spec's constraint says so). The kernel writes Y (x's dtype) and the float32
Mean and RSTD that Liger's backward reads; launch_args returns the three in that order,
and so does reference, so each is validated on its own.

Under Triton's CPU interpreter this kernel cannot run as it ships: its `rsqrt` comes from
libdevice, which the interpreter turns into None. benchmarks/third_party/check_cpu.py runs
it there with that one name swapped for tl.rsqrt, to check this wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from liger_kernel.ops.layer_norm import _layer_norm_forward_kernel
from liger_kernel.ops.utils import calculate_settings

from sweep_kernels import Config, Kernel, Problem

EPS = 1e-5  # LigerLayerNorm's default, as torch.nn.LayerNorm's


def make_inputs(problem: Problem, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, problem["dtype"])
    rows, cols = problem["n_rows"], problem["n_cols"]
    # Rows with a mean and scale of their own, so that Mean and RSTD are not all ~0 and ~1.
    shift = torch.randn(rows, 1, generator=gen, device=device)
    scale = 0.5 + torch.rand(rows, 1, generator=gen, device=device)
    x = torch.randn(rows, cols, generator=gen, device=device) * scale + shift
    w = 1 + 0.1 * torch.randn(cols, generator=gen, device=device)
    b = 0.1 * torch.randn(cols, generator=gen, device=device)
    return x.to(dtype), w.to(dtype), b.to(dtype)


def outputs_for(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Y, Mean, RSTD, as layer_norm_forward allocates them."""
    rows = x.shape[0]
    return (torch.empty_like(x), torch.empty(rows, dtype=torch.float32, device=x.device),
            torch.empty(rows, dtype=torch.float32, device=x.device))


def launch_args(inputs: tuple[torch.Tensor, ...], problem: Problem):
    x, w, b = inputs
    y, mean, rstd = outputs_for(x)
    # Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, W_row_stride, B_ptr, B_row_stride,
    # Mean_ptr, Mean_row_stride, RSTD_ptr, RSTD_row_stride, n_cols, eps; BLOCK_SIZE by keyword.
    return (y, y.stride(0), x, x.stride(0), w, w.stride(0), b, b.stride(0),
            mean, mean.stride(0), rstd, rstd.stride(0), x.shape[1], EPS), (y, mean, rstd)


def reference(inputs: tuple[torch.Tensor, ...], problem: Problem):
    """In float32 throughout, cast once at the end, as the kernel does."""
    x, w, b = inputs
    xf = x.float()
    mean = xf.mean(dim=1)
    centred = xf - mean[:, None]
    rstd = torch.rsqrt(centred.pow(2).mean(dim=1) + EPS)
    y = centred * rstd[:, None] * w.float() + b.float()
    return y.to(x.dtype), mean, rstd


def baseline(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    x, w, b = inputs
    return torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, EPS)


def grid(problem: Problem, config: Config) -> tuple[int, ...]:
    return (problem["n_rows"],)


def _bytes(problem: Problem) -> float:
    size = torch.finfo(getattr(torch, problem["dtype"])).bits // 8
    rows, cols = problem["n_rows"], problem["n_cols"]
    return 2.0 * rows * cols * size + 2.0 * cols * size + 8.0 * rows  # x, y, w, b, mean, rstd


KERNEL = Kernel(
    name="liger-layernorm",
    fn=_layer_norm_forward_kernel,
    problem_defaults={"n_rows": 65536, "n_cols": 4096, "dtype": "bfloat16"},
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    launch_args=launch_args,
    grid=grid,
    bytes_moved=_bytes,
)


def liger_config(problem: Problem) -> dict[str, Any]:
    """layer_norm_forward's launch: calculate_settings' BLOCK_SIZE and num_warps, and
    Triton's default num_stages (Liger passes none; 3 on NVIDIA GPUs)."""
    block, warps = calculate_settings(problem["n_cols"])
    return {"BLOCK_SIZE": block, "num_warps": warps}


Launches = dict[str, tuple[Callable[[], None], dict[str, Any], Callable[[], tuple[Any, ...]]]]


def package_launches(inputs: tuple[torch.Tensor, ...], problem: Problem) -> Launches:
    """`liger`: layer_norm_forward's launch on preallocated outputs; `liger_function`:
    layer_norm_forward itself (LigerLayerNorm's forward, allocating Y, Mean, RSTD)."""
    from liger_kernel.ops.layer_norm import layer_norm_forward

    args, out = launch_args(inputs, problem)
    config = liger_config(problem)

    def launch() -> None:
        _layer_norm_forward_kernel[grid(problem, config)](*args, **config)

    last: list[Any] = []
    x, w, b = inputs

    def function() -> None:
        result = layer_norm_forward(x, w, b, EPS)  # Y, X, Mean, RSTD, BLOCK_SIZE, num_warps
        last[:] = result[0], result[2], result[3]

    return {"liger": (launch, config, lambda: out),
            "liger_function": (function, {"kernel": "layer_norm_forward"}, lambda: tuple(last))}
