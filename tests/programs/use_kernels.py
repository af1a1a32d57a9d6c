"""An autotuned kernel as a program has it, for the tests that load a run's configs back
(tests/test_autotune_use.py): y = x + 1, keyed on N, three configs with one answer."""

import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1, num_stages=1),
           triton.Config({"BLOCK": 32}, num_warps=2, num_stages=1),
           triton.Config({"BLOCK": 64}, num_warps=4, num_stages=1)]


@triton.autotune(configs=CONFIGS, key=["N"])
@triton.jit
def add_one(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < N
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


def grid(meta: dict) -> tuple[int]:
    return (triton.cdiv(meta["N"], meta["BLOCK"]),)
