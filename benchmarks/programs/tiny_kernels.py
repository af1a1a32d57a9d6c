"""The tiny program's kernel (benchmarks/programs/tiny_step.py), in a module of its own so
that a sweep's worker imports it by name (a kernel in `__main__` cannot be).

Under Triton's interpreter its autotune times each config by the wall clock (Triton's own
benchmarker needs a GPU), so the same program runs with Triton's autotune on a CPU too:
that is what lets `autotune_capture.py --cpu` check its whole path here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import triton
import triton.language as tl


def _wall_clock_bench(fn: Callable[[], Any], quantiles: Sequence[float] | None = None,
                      **_: Any) -> Any:
    fn()
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)],
    key=["N"],
    do_bench=_wall_clock_bench if os.environ.get("TRITON_INTERPRET") == "1" else None,
)
@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, alpha, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)
