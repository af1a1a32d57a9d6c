"""A tiny program with one `@triton.autotune` kernel (benchmarks/programs/tiny_kernels.py),
for `autotune_capture.py --cpu`: the driver's whole path (baseline, capture, run, exec, the
comparisons) on a CPU under Triton's interpreter, in seconds. Its output has the form of
the real programs': one JSON line per size.

    TRITON_INTERPRET=1 python benchmarks/programs/tiny_step.py --sizes 100,1000 --device cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import triton

from benchmarks.programs.tiny_kernels import scaled_add_kernel


def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    scaled_add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, 0.5, n)
    return out


def run_case(n: int, args: argparse.Namespace) -> dict[str, Any]:
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    x, y = (torch.randn(n, generator=g).to(args.device) for _ in range(2))
    t0 = time.perf_counter()
    out = step(x, y)
    first = time.perf_counter() - t0
    steady = []
    for _ in range(args.steps):
        s0 = time.perf_counter()
        out = step(x, y)
        steady.append(time.perf_counter() - s0)
    return {"program": "tiny_step", "n": n, "first_step_s": first,
            "steady_step_s": statistics.median(steady), "steady_steps_s": steady,
            "checksum": {"out": float(out.double().abs().sum())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[100, 1000])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for n in args.sizes:
        print(json.dumps(run_case(n, args)), flush=True)


if __name__ == "__main__":
    main()
