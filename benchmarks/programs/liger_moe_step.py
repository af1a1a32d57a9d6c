"""A training step through Liger-Kernel's fused MoE, as a user's program runs it: a router
(softmax, top-k, renormalised weights) in plain torch, then
`liger_kernel.ops.fused_moe.LigerFusedMoEFunction` forward and backward. Its seven
`@triton.autotune` kernels (200 configs, keyed on H_dim and I_dim) tune in-process on the
first step unless answers are loaded (`sweep exec RUN -- python liger_moe_step.py`).

For each (tokens, experts) in turn (every combination of the two lists), one JSON line:
the first step's wall time (forward and backward apart), the steady step's (median of
--steps, torch.cuda.synchronize around each) and a checksum of the outputs and gradients.
The script is unchanged under plain python, `sweep capture` and `sweep exec`.

    python benchmarks/programs/liger_moe_step.py --tokens 256,1024 --experts 8,16
    # on a CPU, to check the code path only (Triton's interpreter, float32, one config):
    TRITON_INTERPRET=1 LIGER_FUSED_MOE_AUTOTUNE=0 python benchmarks/programs/liger_moe_step.py \
        --device cpu --dtype float32 --tokens 8 --experts 4 --hidden 64 --inter 64 --steps 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

STARTED = time.perf_counter()
from liger_kernel.ops.fused_moe import LigerFusedMoEFunction  # noqa: E402

IMPORTED = time.perf_counter()


def counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
    """The router as a Qwen3-MoE block computes it: softmax over the experts in float32,
    the top k, their weights renormalised to sum to one; indices as int32."""
    probs = torch.softmax((x @ router).float(), dim=-1)
    weights, index = torch.topk(probs, top_k, dim=-1)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    return index.to(torch.int32), weights


class Case:
    """One layer's parameters and one batch, made from a seed."""

    def __init__(self, tokens: int, experts: int, args: argparse.Namespace) -> None:
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        dtype, dev = getattr(torch, args.dtype), torch.device(args.device)

        def param(*shape: int, scale: float) -> torch.Tensor:
            t = torch.randn(*shape, generator=g) * scale
            return t.to(device=dev, dtype=dtype).requires_grad_(True)

        h, i = args.hidden, args.inter
        self.x = param(tokens, h, scale=1.0)
        self.router = param(h, experts, scale=h ** -0.5)
        self.gate_up = param(experts, 2 * i, h, scale=h ** -0.5)
        self.down = param(experts, h, i, scale=i ** -0.5)
        self.grad_out = (torch.randn(tokens, h, generator=g) * 0.01).to(dev, dtype)
        self.top_k = args.top_k

    def forward(self) -> torch.Tensor:
        index, weights = route(self.x, self.router, self.top_k)
        return LigerFusedMoEFunction.apply(self.x, self.gate_up, self.down, index, weights)

    def backward(self, out: torch.Tensor) -> None:
        for p in (self.x, self.router, self.gate_up, self.down):
            p.grad = None
        out.backward(self.grad_out)

    def checksum(self, out: torch.Tensor) -> dict[str, float]:
        tensors = {"out": out, "dx": self.x.grad, "drouter": self.router.grad,
                   "dgate_up": self.gate_up.grad, "ddown": self.down.grad}
        return {k: float(t.detach().double().abs().sum()) for k, t in tensors.items()
                if t is not None}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_case(tokens: int, experts: int, args: argparse.Namespace) -> dict[str, Any]:
    case = Case(tokens, experts, args)
    sync(args.device)
    t0 = time.perf_counter()
    out = case.forward()
    sync(args.device)
    t1 = time.perf_counter()
    case.backward(out)
    sync(args.device)
    t2 = time.perf_counter()
    steady = []
    for _ in range(args.steps):
        sync(args.device)
        s0 = time.perf_counter()
        out = case.forward()
        case.backward(out)
        sync(args.device)
        steady.append(time.perf_counter() - s0)
    return {"program": "liger_moe_step", "tokens": tokens, "experts": experts,
            "hidden": args.hidden, "inter": args.inter, "top_k": args.top_k,
            "dtype": args.dtype, "import_s": IMPORTED - STARTED, "first_step_s": t2 - t0,
            "first_forward_s": t1 - t0, "first_backward_s": t2 - t1,
            "steady_step_s": statistics.median(steady), "steady_steps_s": steady,
            "checksum": case.checksum(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=counts, default=[256], help="e.g. 256,1024")
    ap.add_argument("--experts", type=counts, default=[8], help="e.g. 8,16")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=3584)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="steady steps timed (the median)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for experts in args.experts:
        for tokens in args.tokens:
            print(json.dumps(run_case(tokens, experts, args)), flush=True)


if __name__ == "__main__":
    main()
