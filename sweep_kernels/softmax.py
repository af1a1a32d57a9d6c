"""Row-wise softmax, memory-bound: an online max/sum pass over column tiles, then a
normalising pass, so any BLOCK_N works for any row length. torch is imported where inputs
are made (see matmul.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from sweep_kernels import Config, Kernel, Problem
from sweep_kernels.record import ELEMENT_BYTES

if TYPE_CHECKING:
    import torch


@triton.jit
def softmax_kernel(
    x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y,
    BLOCK_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
):
    first_row = tl.program_id(0) * ROWS_PER_PROGRAM
    cols = tl.arange(0, BLOCK_N)
    for r in range(0, ROWS_PER_PROGRAM):
        row = first_row + r
        if row < n_rows:
            x_row = x_ptr + row * stride_x
            y_row = y_ptr + row * stride_y
            run_max = tl.full((BLOCK_N,), float("-inf"), tl.float32)
            run_sum = tl.zeros((BLOCK_N,), tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
                new_max = tl.maximum(run_max, x)
                # Lanes still at -inf have seen nothing yet; keep their sum at zero.
                scale = tl.where(new_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
                term = tl.where(new_max == float("-inf"), 0.0, tl.exp(x - new_max))
                run_sum = run_sum * scale + term
                run_max = new_max
            row_max = tl.max(run_max, axis=0)
            row_sum = tl.sum(run_sum * tl.exp(run_max - row_max), axis=0)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
                y = tl.exp(x - row_max) / row_sum
                tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def make_inputs(problem: Problem, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, problem["dtype"])
    x = torch.randn(problem["rows"], problem["cols"], generator=gen, device=device) * 4
    return (x.to(dtype),)


def reference(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    import torch

    return torch.softmax(inputs[0].float(), dim=-1)


def baseline(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    import torch

    return torch.softmax(inputs[0], dim=-1)  # at the input's precision, as the kernel


def launch_args(inputs: tuple[torch.Tensor, ...], problem: Problem):
    import torch

    (x,) = inputs
    y = torch.empty_like(x)
    return (x, y, x.shape[0], x.shape[1], x.stride(0), y.stride(0)), y


def grid(problem: Problem, config: Config) -> tuple[int, ...]:
    return (triton.cdiv(problem["rows"], config.get("ROWS_PER_PROGRAM", 1)),)


KERNEL = Kernel(
    name="softmax",
    fn=softmax_kernel,
    problem_defaults={"rows": 4096, "cols": 4096, "dtype": "float16"},
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    launch_args=launch_args,
    grid=grid,
    bytes_moved=lambda p: 2.0 * p["rows"] * p["cols"] * ELEMENT_BYTES[p["dtype"]],
)
