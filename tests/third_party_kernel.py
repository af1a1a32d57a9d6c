"""A kernel written as third-party kernels are: a flag that is no tuning parameter
(HAS_BIAS, a required constexpr), rows per program and a plain scalar with defaults, and
two outputs (the activation and its input, kept for a backward pass).

The wrapper below is what a user writes around it: this one always adds the bias, so the
spec fixes HAS_BIAS: true; the kernel record fixes `scale` and ROWS by default. The
variants break one thing each, for the tests of validation, and one stands in for the
compiler to show what a compile is given."""

import json
from dataclasses import replace

import torch
import triton
import triton.language as tl

from sweep_kernels import Kernel

SCALE = 0.5


@triton.jit
def bias_relu_kernel(x_ptr, bias_ptr, y_ptr, pre_ptr, n_rows, n_cols,
                     BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr = 1,
                     scale=1.0):
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    for r in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + r
        mask = col_ok & (cols * 0 + row < n_rows)  # a block: the interpreter takes no scalar
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
        if HAS_BIAS:
            x += tl.load(bias_ptr + cols, mask=col_ok, other=0.0)
        pre = x * scale
        tl.store(pre_ptr + row * n_cols + cols, pre, mask=mask)
        tl.store(y_ptr + row * n_cols + cols, tl.maximum(pre, 0.0), mask=mask)


def make_inputs(problem, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, problem["dtype"])
    x = torch.randn(problem["rows"], problem["cols"], generator=g, device=device).to(dtype)
    bias = torch.randn(problem["cols"], generator=g, device=device).to(dtype)
    return x, bias


def reference(inputs, problem):
    x, bias = inputs
    pre = (x.float() + bias.float()) * SCALE
    return torch.relu(pre).to(x.dtype), pre.to(x.dtype)


def launch_args(inputs, problem):
    x, bias = inputs
    y, pre = torch.empty_like(x), torch.empty_like(x)
    return (x, bias, y, pre, x.shape[0], x.shape[1]), (y, pre)


def grid(problem, config):
    # ROWS is a fixed value, not a tuned one: the grid sees it all the same.
    return (triton.cdiv(problem["rows"], config["ROWS"]),)


KERNEL = Kernel(
    name="bias_relu", fn=bias_relu_kernel,
    problem_defaults={"rows": 6, "cols": 50, "dtype": "float32"},
    make_inputs=make_inputs, reference=reference, launch_args=launch_args, grid=grid,
    fixed={"scale": SCALE, "ROWS": 1})

# The second output's reference is off: that output, and only it, must fail validation.
SECOND_WRONG = replace(KERNEL, reference=lambda inputs, problem: (
    reference(inputs, problem)[0], reference(inputs, problem)[1] + 1))
# A default for a keyword argument the function does not have.
MISSPELT_DEFAULT = replace(KERNEL, fixed={"SCALE": SCALE})
# A reference of one output for a kernel that fills two.
ONE_REFERENCE = replace(KERNEL, reference=lambda inputs, problem: reference(inputs, problem)[0])


class EchoCompile:
    """Fails every compile with what it was given: the keywords and the grid."""

    def warmup(self, *args, grid, **keywords):
        raise RuntimeError(f"compiled with {json.dumps(keywords, sort_keys=True)} grid {grid}")


ECHO_COMPILE = replace(KERNEL, fn=EchoCompile())
