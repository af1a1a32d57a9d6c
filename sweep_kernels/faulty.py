"""A copy kernel whose MODE parameter picks an outcome, to show and test how each is
recorded with real Triton: 0 copies correctly, 1 writes wrong numbers (`incorrect`),
2 fails while running under the interpreter (a ZeroDivisionError in the kernel body:
`runtime_error`), 3 stores terabytes out of bounds (`crashed`: on a GPU an illegal memory
access, which poisons the launching process's CUDA context; under the interpreter a
segmentation fault that kills it). A BLOCK that is not a power of two breaks Triton's
language rules (`compile_error`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sweep_kernels import Kernel


@triton.jit
def scale_copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if MODE == 1:
        x = x * 2
    if MODE == 2:
        x = x * (1 // (MODE - 2))
    if MODE == 3:
        tl.store(y_ptr + offs + (1 << 40), x, mask=mask)
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
