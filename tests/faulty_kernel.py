"""A test-only kernel whose MODE parameter picks an outcome, to pin each status down with
real Triton: 0 copies correctly, 1 writes wrong numbers, 2 fails while running
(a ZeroDivisionError in the kernel body), and a BLOCK that is not a power of two is
rejected by Triton's language rules."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import Kernel


@triton.jit
def scale_copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if MODE == 1:
        x = x * 2
    if MODE == 2:
        x = x * (1 // (MODE - 2))
    tl.store(y_ptr + offs, x, mask=mask)


def _inputs(problem, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.rand(problem["n"], generator=gen, device=device) + 0.5,)


def _launch_args(inputs, problem):
    (x,) = inputs
    y = torch.empty_like(x)
    return (x, y, x.numel()), y


KERNEL = Kernel(
    name="faulty",
    fn=scale_copy,
    problem_defaults={"n": 1000},
    make_inputs=_inputs,
    reference=lambda inputs, problem: inputs[0].clone(),
    launch_args=_launch_args,
    grid=lambda problem, config: (triton.cdiv(problem["n"], config["BLOCK"]),),
)
