"""A program with autotuned kernels (autotuned_kernels.py), as a user runs it: each kernel
at two sizes, then one checksum line of its results. `--exit N` ends it with sys.exit(N)
after its calls; `--unheld` also calls a kernel no module attribute holds."""

from __future__ import annotations

import sys

import autotuned_kernels as k
import torch
import triton


def main(argv: list[str]) -> int:
    torch.manual_seed(0)
    total = 0.0
    for n in (24, 48):
        x, r = torch.randn(3, n), torch.randn(3, n)
        s, y = k.fused_add_norm(x, r, torch.rand(n) + 0.5)
        total += float(s.sum()) + float(y.abs().sum())
    table = torch.randn(10, 40)
    for d in (16, 40):
        index = torch.tensor([7, 2, 2, 9, 0], dtype=torch.int64)
        total += float(k.gather(table[:, :d].contiguous(), index).sum())
    if "--unheld" in argv:
        x = torch.ones(20)
        k.make_unheld()[lambda META: (triton.cdiv(20, META["BLOCK"]),)](x, 20)
        total += float(x.sum())
    print(f"checksum {total:.4f}")
    if "--exit" in argv:
        return int(argv[argv.index("--exit") + 1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
