"""Autotuned kernels that write their own inputs: one doubles its input in place (Triton
restores it between configs: restore_value), one adds into an output it also reads."""

import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=1)]


@triton.autotune(configs=CONFIGS, key=["n"], restore_value=["x_ptr"])
@triton.jit
def double(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def accumulate(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    total = tl.load(out_ptr + i, mask=i < n) + tl.load(x_ptr + i, mask=i < n)
    tl.store(out_ptr + i, total, mask=i < n)
