"""C = A @ B with a GROUP_M-swizzled tile order, for float16, bfloat16 and float32.

torch is imported where inputs are made, not with the module: the command that checks a
spec against this kernel (the sweep's driver) then never imports it (two of the
quickstart's seconds on a 2-core machine, where the workers import it meanwhile)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from sweep_kernels import Config, Kernel, Problem
from sweep_kernels.record import ELEMENT_BYTES

if TYPE_CHECKING:
    import torch


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Programs walk C in groups of GROUP_M tile-rows, so neighbouring programs share
    # A's rows and B's columns in L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def make_inputs(problem: Problem, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, problem["dtype"])
    a = torch.randn(problem["M"], problem["K"], generator=gen, device=device, dtype=dtype)
    b = torch.randn(problem["K"], problem["N"], generator=gen, device=device, dtype=dtype)
    return a, b


def reference(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    import torch

    a, b = inputs
    # 16-bit values are exact in TF32 (10 mantissa bits) and TF32 tensor cores accumulate in
    # float32, so for them TF32 gives the float32 product at a fraction of its cost (on an
    # H200 a float32 8192^3 reference took longer than timing the kernel).
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = a.dtype in (torch.float16, torch.bfloat16)
    try:
        return a.float() @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def baseline(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    a, b = inputs
    return a @ b  # cuBLAS at the inputs' precision: what the kernel would replace


def launch_args(inputs: tuple[torch.Tensor, ...], problem: Problem):
    import torch

    a, b = inputs
    c = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
    args = (a, b, c, a.shape[0], b.shape[1], a.shape[1],
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return args, c


def grid(problem: Problem, config: Config) -> tuple[int, ...]:
    return (triton.cdiv(problem["M"], config["BLOCK_M"])
            * triton.cdiv(problem["N"], config["BLOCK_N"]),)


KERNEL = Kernel(
    name="matmul",
    fn=matmul_kernel,
    problem_defaults={"M": 1024, "N": 1024, "K": 1024, "dtype": "float16"},
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    launch_args=launch_args,
    grid=grid,
    flops=lambda p: 2.0 * p["M"] * p["N"] * p["K"],
    bytes_moved=lambda p: (p["M"] * p["K"] + p["K"] * p["N"] + p["M"] * p["N"])
    * ELEMENT_BYTES[p["dtype"]],
)
