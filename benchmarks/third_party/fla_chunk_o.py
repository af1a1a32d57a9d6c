"""flash-linear-attention's (fla-core 0.6.0) `chunk_fwd_kernel_o` as a sweep kernel:
`kernel: fla_chunk_o:KERNEL`, run from this folder.

The output stage of every chunked linear-attention op in fla (GLA, DeltaNet, GDN,
retention, ...): for each chunk of BT tokens, with the chunk's state h (K x V, from
chunk_fwd_h) given,

    o = scale * (q @ h + tril(q @ k^T) @ v)

q, k: [B, T, H, K]; v, o: [B, T, HV, V] (HV a multiple of H: value heads share q/k heads);
h: [B, NT, HV, K, V], NT = cdiv(T, BT). Tuned: the tiles BK, BV and num_warps, num_stages.
fla itself autotunes among three configs on Hopper (`package_launches` runs its autotuner
and reads its pick).

The fla function is wrapped twice: @triton.heuristics sets USE_G, USE_G_GAMMA, IS_VARLEN
from its arguments, and fla's autotuner sets BK, BV; the sweep takes the bare JITFunction,
so the kernel record fixes those flags (no gates, no variable lengths). H, HV, K, V and BT
are tl.constexprs without a default, which a spec must give under `fixed:`; they must
equal the problem's H, HV, K, V and chunk_size (`check_fixed` says where they differ).

This one runs under Triton's CPU interpreter as it ships (float16/float32):
benchmarks/third_party/check_cpu.py runs a small problem through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
from fla.ops.common import chunk_o as fla_chunk_o
from triton.runtime.autotuner import Autotuner, Heuristics

from sweep_kernels import Config, Kernel, Problem


def _bare(fn: Any) -> Any:
    """The JITFunction under fla's @triton.heuristics and autotuner."""
    while isinstance(fn, (Heuristics, Autotuner)):
        fn = fn.fn
    return fn


DECORATED = fla_chunk_o.chunk_fwd_kernel_o  # Heuristics(CachedAutotuner(JITFunction))
BARE = _bare(DECORATED)
SHAPE = {"H": "H", "HV": "HV", "K": "K", "V": "V", "BT": "chunk_size"}  # constexpr: problem
FLAGS = {"USE_G": False, "USE_G_GAMMA": False, "STATE_V_FIRST": False, "IS_VARLEN": False}
DEFAULTS = {"B": 8, "T": 4096, "H": 16, "HV": 16, "K": 128, "V": 128, "chunk_size": 64,
            "dtype": "bfloat16"}


def chunks(problem: Problem) -> int:
    return triton.cdiv(problem["T"], problem["chunk_size"])


def make_inputs(problem: Problem, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, problem["dtype"])
    b, t, h, hv, k, v = (problem[n] for n in ("B", "T", "H", "HV", "K", "V"))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    return randn(b, t, h, k), randn(b, t, h, k), randn(b, t, hv, v), \
        randn(b, chunks(problem), hv, k, v)


def scale_of(problem: Problem) -> float:
    return problem["K"] ** -0.5  # chunk_fwd_o's default


def launch_args(inputs: tuple[torch.Tensor, ...], problem: Problem):
    q, k, v, h = inputs
    o = torch.empty_like(v)
    # q, k, v, h, g, g_gamma, o, cu_seqlens, chunk_indices, scale, T; the constexprs
    # (H, HV, K, V, BT, BK, BV and the flags) by keyword.
    return (q, k, v, h, None, None, o, None, None, scale_of(problem), problem["T"]), o


def reference(inputs: tuple[torch.Tensor, ...], problem: Problem) -> torch.Tensor:
    """In float32, chunk by chunk, a tail chunk padded with zeros."""
    q, k, v, h = (x.float() for x in inputs)
    b, t = q.shape[:2]
    hv, dv = v.shape[2], v.shape[3]
    bt, nt = problem["chunk_size"], chunks(problem)
    pad = nt * bt - t

    def blocks(x: torch.Tensor) -> torch.Tensor:  # [B, T, *, D] -> [B, NT, BT, HV, D]
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        x = x.reshape(b, nt, bt, x.shape[2], x.shape[3])
        return x.repeat_interleave(hv // x.shape[3], dim=3) if x.shape[3] != hv else x

    qb, kb, vb = blocks(q), blocks(k), blocks(v)
    inter = torch.einsum("bnthk,bnhkv->bnthv", qb, h)
    scores = torch.einsum("bnthk,bnshk->bnhts", qb, kb)
    scores = scores * torch.ones(bt, bt, device=q.device).tril()
    intra = torch.einsum("bnhts,bnshv->bnthv", scores, vb)
    o = (inter + intra) * scale_of(problem)
    return o.reshape(b, nt * bt, hv, dv)[:, :t].to(inputs[2].dtype)


def grid(problem: Problem, config: Config) -> tuple[int, ...]:
    """chunk_fwd_o's: value tiles times chunks (flattened into axis 0), batch times heads."""
    return (triton.cdiv(problem["V"], config["BV"]) * chunks(problem),
            problem["B"] * problem["HV"])


def shape_of(problem: Problem) -> dict[str, int]:
    """The shape constexprs for a problem, as a spec's `fixed:` must give them."""
    return {c: problem[p] for c, p in SHAPE.items()}


def check_fixed(problem: Problem, fixed: Config) -> list[str]:
    """Where the shape constexprs the launch gets differ from the problem's sizes."""
    merged = {**KERNEL.fixed, **fixed}
    return [f"fixed {c}={merged.get(c)!r} but problem {p}={problem[p]!r}"
            for c, p in SHAPE.items() if merged.get(c) != problem[p]]


def _flops(problem: Problem) -> float:
    b, t, hv, k, v, bt = (problem[n] for n in ("B", "T", "HV", "K", "V", "chunk_size"))
    # per token: q @ h (2KV), q @ k^T (2 BT K), A @ v (2 BT V)
    return 2.0 * b * t * hv * (k * v + bt * k + bt * v)


def _bytes(problem: Problem) -> float:
    size = torch.finfo(getattr(torch, problem["dtype"])).bits // 8
    b, t, h, hv, k, v = (problem[n] for n in ("B", "T", "H", "HV", "K", "V"))
    return size * (2.0 * b * t * h * k + 2.0 * b * t * hv * v + b * chunks(problem) * hv * k * v)


KERNEL = Kernel(
    name="fla-chunk-fwd-o",
    fn=BARE,
    problem_defaults=DEFAULTS,
    make_inputs=make_inputs,
    reference=reference,
    launch_args=launch_args,
    grid=grid,
    flops=_flops,
    bytes_moved=_bytes,
    fixed={**{c: DEFAULTS[p] for c, p in SHAPE.items()}, **FLAGS},
)


def fla_configs() -> list[dict[str, Any]]:
    """The configs fla's autotuner chooses among on this machine (three on Hopper)."""
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
            for c in fla_chunk_o._O_CONFIGS]


Launches = dict[str, tuple[Callable[[], None], dict[str, Any], Callable[[], tuple[Any, ...]]]]


def package_launches(inputs: tuple[torch.Tensor, ...], problem: Problem) -> Launches:
    """`fla`: the bare kernel at the config fla's own autotuner picks for these inputs (it
    runs here, on the first call, as it would in fla); `fla_function`: fla's chunk_fwd_o
    itself (allocating o, its launch going through the heuristics and the autotuner)."""
    q, k, v, h = inputs
    scale, bt = scale_of(problem), problem["chunk_size"]
    fla_chunk_o.chunk_fwd_o(q, k, v, h, scale=scale, chunk_size=bt)  # autotunes
    tuner = DECORATED.fn
    best = tuner.best_config
    config = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
    # What fla's autotuner measured (absent where it found its pick in Triton's disk cache).
    measured = {str(c): [float(t) for t in (ms if isinstance(ms, (list, tuple)) else [ms])]
                for c, ms in (getattr(tuner, "configs_timings", None) or {}).items()}
    args, out = launch_args(inputs, problem)
    keywords = {**KERNEL.fixed, **shape_of(problem), **config}
    g = grid(problem, keywords)

    def launch() -> None:
        BARE[g](*args, **keywords)

    last: list[Any] = []

    def function() -> None:
        last[:] = [fla_chunk_o.chunk_fwd_o(q, k, v, h, scale=scale, chunk_size=bt)]

    return {"fla": (launch, config, lambda: (out,)),
            "fla_function": (function, {"kernel": "chunk_fwd_o", "candidates": fla_configs(),
                                        "autotuner_ms": measured}, lambda: tuple(last))}
