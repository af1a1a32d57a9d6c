"""A training step through flash-linear-attention (fla-core 0.6.0), as a Gated DeltaNet
layer runs it: q and k L2-normalised per head (`fla.modules.l2norm.l2norm`), the chunked
gated delta rule (`fla.ops.gated_delta_rule.chunk_gated_delta_rule`), then an RMSNorm over
each head's output (`fla.modules.layernorm.rms_norm`), forward and backward.

Its `@triton.autotune` kernels tune in-process on the first step unless answers are
loaded (`sweep exec RUN -- python fla_step.py`): l2norm_fwd_kernel and l2norm_bwd_kernel
(25 configs each, keyed on D and NB, the token count's bucket), layer_norm_fwd_kernel (9,
keyed on D and NB), and the delta rule's own (most under `@triton.heuristics`, so the
module attribute holds the heuristics, not the autotuner). --ops picks the parts: without
"gdn" the normalised q and k and v are summed in plain torch instead.

For each sequence length in turn, one JSON line: the first step's wall time (forward and
backward apart), the steady step's (median of --steps, torch.cuda.synchronize around each)
and a checksum of the outputs and gradients.

    python benchmarks/programs/fla_step.py --seq 4096,16384
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

STARTED = time.perf_counter()
from fla.modules.l2norm import l2norm  # noqa: E402
from fla.modules.layernorm import rms_norm  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402

IMPORTED = time.perf_counter()
OPS = ("l2norm", "gdn", "rmsnorm")


def counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def names(text: str) -> list[str]:
    chosen = [x for x in text.split(",") if x]
    unknown = [x for x in chosen if x not in OPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown op {unknown[0]!r}; known: {', '.join(OPS)}")
    return chosen


class Case:
    """One layer's inputs and parameters for one sequence length, made from a seed."""

    def __init__(self, seq: int, args: argparse.Namespace) -> None:
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        dtype, dev = getattr(torch, args.dtype), torch.device(args.device)
        b, h, d = args.batch, args.heads, args.head_dim

        def leaf(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
            t = torch.randn(*shape, generator=g) * scale + shift
            return t.to(device=dev, dtype=dtype).requires_grad_(True)

        self.q, self.k, self.v = (leaf(b, seq, h, d) for _ in range(3))
        self.gate = leaf(b, seq, h, shift=3.0)  # logsigmoid of it: a slow decay
        self.beta = leaf(b, seq, h)
        self.weight = leaf(d, scale=0.1, shift=1.0)
        self.grad_out = (torch.randn(b, seq, h, d, generator=g) * 0.01).to(dev, dtype)
        self.ops = args.ops
        self.leaves = (self.q, self.k, self.v, self.gate, self.beta, self.weight)

    def forward(self) -> torch.Tensor:
        q, k = self.q, self.k
        if "l2norm" in self.ops:
            q, k = l2norm(q), l2norm(k)
        if "gdn" in self.ops:
            o, _ = chunk_gated_delta_rule(q, k, self.v, torch.nn.functional.logsigmoid(
                self.gate.float()).to(q.dtype), self.beta.sigmoid())
        else:
            o = q + k + self.v
        if "rmsnorm" in self.ops:
            o = rms_norm(o.reshape(-1, o.shape[-1]), self.weight, None).view_as(o)
        return o

    def backward(self, out: torch.Tensor) -> None:
        for p in self.leaves:
            p.grad = None
        out.backward(self.grad_out)

    def checksum(self, out: torch.Tensor) -> dict[str, float]:
        tensors = {"out": out, "dq": self.q.grad, "dk": self.k.grad, "dv": self.v.grad,
                   "dgate": self.gate.grad, "dbeta": self.beta.grad,
                   "dweight": self.weight.grad}
        return {k: float(t.detach().double().abs().sum()) for k, t in tensors.items()
                if t is not None}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_case(seq: int, args: argparse.Namespace) -> dict[str, Any]:
    case = Case(seq, args)
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
    return {"program": "fla_step", "ops": args.ops, "batch": args.batch, "seq": seq,
            "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype,
            "import_s": IMPORTED - STARTED, "first_step_s": t2 - t0,
            "first_forward_s": t1 - t0, "first_backward_s": t2 - t1,
            "steady_step_s": statistics.median(steady), "steady_steps_s": steady,
            "checksum": case.checksum(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=counts, default=[4096], help="e.g. 4096,16384")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--ops", type=names, default=list(OPS), help=",".join(OPS))
    ap.add_argument("--steps", type=int, default=5, help="steady steps timed (the median)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for seq in args.seq:
        print(json.dumps(run_case(seq, args)), flush=True)


if __name__ == "__main__":
    main()
