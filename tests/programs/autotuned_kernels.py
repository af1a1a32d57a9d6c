"""Kernels written as the field writes them, with `@triton.autotune`: a fused add + RMS norm
writing two outputs (the sum, kept as the next residual, and the normed rows), and a gather
of table rows by an int64 index tensor, its grid a function of the config. What `sweep
capture`'s tests capture (autotuned_app.py calls them).

Triton cannot benchmark under the CPU interpreter; with AUTOTUNED_APP_CPU_BENCH=1 these
tuners time each config with the clock instead (the program's own results, tuned, to
compare a capture's with). `make_unheld` builds a tuner no module attribute holds."""

from __future__ import annotations

import os
import time

import triton
import triton.language as tl


def _cpu_bench(kernel_call, quantiles):
    started = time.perf_counter()
    kernel_call()
    return [time.perf_counter() - started] * len(quantiles)


BENCH = _cpu_bench if os.environ.get("AUTOTUNED_APP_CPU_BENCH") == "1" else None


@triton.autotune(
    configs=[triton.Config({"BLOCK": 16}, num_warps=1),
             triton.Config({"BLOCK": 32}, num_warps=2),
             triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2)],
    key=["N"], do_bench=BENCH)
@triton.jit
def add_norm(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    squares = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < N
        s = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0) + \
            tl.load(r_ptr + row * N + cols, mask=ok, other=0.0)
        tl.store(sum_ptr + row * N + cols, s, mask=ok)
        squares += s * s
    scale = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / N + eps)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < N
        s = tl.load(sum_ptr + row * N + cols, mask=ok, other=0.0)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
        tl.store(out_ptr + row * N + cols, s * scale * w, mask=ok)


@triton.autotune(
    configs=[triton.Config({"BLOCK_D": 8}, num_warps=1),
             triton.Config({"BLOCK_D": 16}, num_warps=2),
             triton.Config({"BLOCK_D": 32}, num_warps=2)],
    key=["D"], do_bench=BENCH)
@triton.heuristics({"EVEN_D": lambda args: args["D"] % args["BLOCK_D"] == 0})
@triton.jit
def gather_rows(table_ptr, index_ptr, out_ptr, D, BLOCK_D: tl.constexpr,
                EVEN_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    source = tl.load(index_ptr + row)
    if EVEN_D:
        tl.store(out_ptr + row * D + cols, tl.load(table_ptr + source * D + cols))
    else:
        ok = cols < D
        tl.store(out_ptr + row * D + cols, tl.load(table_ptr + source * D + cols, mask=ok),
                 mask=ok)


def fused_add_norm(x, residual, weight, eps=1e-6):
    """(x + residual, rms_norm(x + residual) * weight), rows of N."""
    import torch

    rows, n = x.shape
    total, out = torch.empty_like(x), torch.empty_like(x)
    add_norm[(rows,)](x, residual, weight, total, out, n, eps)
    return total, out


def gather(table, index):
    """table[index], rows of D."""
    import torch

    n_rows, d = index.numel(), table.shape[1]
    out = torch.empty((n_rows, d), dtype=table.dtype)
    gather_rows[lambda META: (n_rows, triton.cdiv(META["D"], META["BLOCK_D"]))](
        table, index, out, d)
    return out


def make_unheld():
    """An autotuned kernel made inside a function: no module attribute holds its tuner, so
    a worker could never import it. It doubles x in place: restore_value keeps Triton's
    tuning launches from doubling it again."""

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})],
                     key=["n"], restore_value=["x_ptr"], do_bench=BENCH)
    @triton.jit
    def double(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

    return double
