"""Autotuned kernels for tests that make a capture by hand (tests/test_captured_kernel.py):
a scaled gather through an index tensor, and one whose config pre_hook always raises."""

import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1, num_stages=1),
           triton.Config({"BLOCK": 32}, num_warps=1, num_stages=1),
           triton.Config({"BLOCK": 64}, num_warps=2, num_stages=1)]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def gather2(x_ptr, y_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    i = tl.load(idx_ptr + offs, mask=mask, other=0)
    tl.store(y_ptr + offs, tl.load(x_ptr + i, mask=mask) * 2, mask=mask)


def _refuse(args):
    raise RuntimeError("this pre_hook needs the program's state")


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1, num_stages=1,
                                        pre_hook=_refuse),
                          triton.Config({"BLOCK": 32}, num_warps=1, num_stages=1,
                                        pre_hook=_refuse)], key=["n"])
@triton.jit
def hooked(x_ptr, y_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
