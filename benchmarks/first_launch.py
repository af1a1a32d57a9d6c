"""A process's first launch of a Triton kernel already in Triton's cache: how long it
takes against the second, and what it imports (on the GPU machine, run twice with one
TRITON_CACHE_DIR: the first run fills it). It showed the hash Triton makes of its own
sources (actors/triton_warm.py) on a launcher's first trial: 0.47 s there, 1.5 ms after.

Usage: TRITON_CACHE_DIR=DIR python3 benchmarks/first_launch.py  (prints one JSON line)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIGS = [{"BLOCK_M": m, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
            "num_stages": 3} for m in (64, 128)]


def main() -> None:
    t = time.time()
    import torch
    import triton  # noqa: F401

    out: dict[str, object] = {"import_s": time.time() - t}
    from sweep_kernels.matmul import KERNEL

    problem = {"M": 1024, "N": 1024, "K": 1024, "dtype": "float16"}
    args, _ = KERNEL.launch_args(KERNEL.make_inputs(problem, "cuda", 0), problem)
    for n, config in enumerate(CONFIGS):
        before = set(sys.modules)
        t = time.time()
        KERNEL.fn[KERNEL.grid(problem, config)](*args, **config)
        torch.cuda.synchronize()
        out[f"launch{n}_s"] = time.time() - t
        new = set(sys.modules) - before
        out[f"launch{n}_new_modules"] = len(new)
        out[f"launch{n}_top"] = sorted({".".join(m.split(".")[:2]) for m in new})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
