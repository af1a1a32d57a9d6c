"""GPU sweep benchmark, one call on a machine with 2 GPUs (the device tool's nvidia-h200-x2).

(a) The 64-config matmul space of configs/matmul.yaml (8192^3 bfloat16): `triton.autotune`
    on one GPU as the baseline, then this project on 1 and on 2 GPUs, each with an empty
    Triton cache; the project's time is from its first dispatch to the table written
    (finalists re-timed included). Then two more 2-GPU sweeps with the cache warm, to see
    whether repeated sweeps pick the same config, and every config of the space re-timed
    interleaved, to see how far the pick is from the best any config achieves.
(b) A space of 600 matmul configs (4096^3 float16) with configs that cannot compile
    (BLOCK_N 48) or exceed shared memory, on 1 and on 2 GPUs.
(c) Softmax (memory-bound) against the copy bandwidth measured in the same run.
And torch.matmul in the same run, against which the best config's TFLOP/s is reported.

Usage (on the GPU machine): python3 benchmarks/gpu_sweep.py --out DIR
Writes DIR/gpu_sweep-DATE.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# (b): 600 matmul configs, some of which cannot compile (also time_to_answer.py's).
SPEC_600 = {"name": "matmul-600", "kernel": "matmul",
            "problem": {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"},
            "space": {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [32, 48, 64, 128, 256],
                      "BLOCK_K": [32, 64, 128], "GROUP_M": [8], "num_warps": [4, 8],
                      "num_stages": [2, 3, 4, 5]},
            "timing": {"warmup_ms": 10, "rep_ms": 25},
            "validation": {"rtol": 0.01, "atol": 0.05},
            "run": {"backend": "cuda", "trial_timeout_s": 120}}


def sweep(spec: dict, tmp: Path, name: str, cache: Path) -> dict:
    """Run `sweep run` on a spec; returns its timings, picks and counts."""
    spec_path = tmp / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp / name
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "sweep", "run", spec_path, "--out", out,
                           "--force"],  # tune again although an earlier run was cached
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    best = json.loads((out / "best.json").read_text())
    import pyarrow.parquet as pq

    table = pq.read_table(out / "trials.parquet")
    rows = table.to_pylist()
    return {**busy(rows, snap["first_dispatch_at"]),
        "name": name, "command_s": wall,
        "sweep_s": snap["written_at"] - snap["first_dispatch_at"],
        "counts": snap["counts"], "trials": len(rows),
        "best": {k: best[k] for k in ("index", "config", "latency_ms", "device")},
        "finalists": best["finalists"],
        "statuses_all_set": all(r["status"] for r in rows),
        "compile_ms_sum": sum(r["compile_ms"] or 0 for r in rows),
        "errors_sample": sorted({(r["error"] or "")[:120] for r in rows if r["error"]})[:6],
        "rows": [{**{k: r[k] for k in ("index", "status", "latency_ms", "config", "worker",
                                        "compile_ms")},
                  "started_at": r["started_at"].timestamp(),
                  "finished_at": r["finished_at"].timestamp()} for r in rows],
    }


def busy(rows: list[dict], first_dispatch_at: float) -> dict:
    """How much of the sweep each worker spent on trials (compile waits included), and how
    long the driver took from the last trial to the table written (finalists included)."""
    workers = sorted({r["worker"] for r in rows})
    last = max(r["finished_at"].timestamp() for r in rows)
    span = last - first_dispatch_at
    per_worker = {w: sum((r["finished_at"] - r["started_at"]).total_seconds()
                         for r in rows if r["worker"] == w) / span for w in workers}
    return {"workers": workers, "trials_span_s": span, "busy_fraction": per_worker}


AUTOTUNE = r"""
import json, sys, time, torch, triton
from sweep_kernels.matmul import matmul_kernel
space = json.loads(sys.argv[1])
configs = [triton.Config({k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
                         num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in space]
M = N = K = 8192
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(matmul_kernel)
grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)
t0 = time.time()
tuned[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1))
torch.cuda.synchronize()
took = time.time() - t0
best = tuned.best_config
print(json.dumps({"seconds": took, "best": {**best.kwargs, "num_warps": best.num_warps,
                                             "num_stages": best.num_stages}}))
"""


def autotune_baseline(space: list[dict], cache: Path) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": "0"}
    out = subprocess.run([sys.executable, "-c", AUTOTUNE, json.dumps(space)], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def device_measurements(configs: list[dict]) -> dict:
    """torch.matmul, the copy bandwidth, and every ok config of (a) re-timed interleaved."""
    import torch
    import triton
    import triton.testing

    from actors.timing import time_cuda
    from sweep_kernels.matmul import KERNEL

    problem = {"M": 8192, "N": 8192, "K": 8192, "dtype": "bfloat16"}
    a, b = KERNEL.make_inputs(problem, "cuda", 0)
    mm = time_cuda(lambda: torch.matmul(a, b), 25, 100)
    # What validating one config costs: fresh inputs, the float32 reference, the comparison.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for seed in range(3):
        inputs = KERNEL.make_inputs(problem, "cuda", seed + 1)
        expected = KERNEL.reference(inputs, problem)
        torch.allclose(expected, expected)
    torch.cuda.synchronize()
    validate_ms = (time.perf_counter() - t0) / 3 * 1e3
    del inputs, expected
    x = torch.randn(1 << 30, device="cuda", dtype=torch.float16)  # 2 GiB
    y = torch.empty_like(x)
    copy = time_cuda(lambda: y.copy_(x), 25, 100)
    args, _ = KERNEL.launch_args((a, b), problem)
    fn = KERNEL.fn
    launches = [(lambda c=c: fn[KERNEL.grid(problem, c)](*args, **c)) for c in configs]
    samples: list[list[float]] = [[] for _ in configs]
    for _ in range(3):
        for launch, got in zip(launches, samples):
            got.append(triton.testing.do_bench(launch, warmup=25, rep=100,
                                               return_mode="median"))
    return {
        "torch_matmul_ms": mm.median_ms, "torch_matmul_tflops": 2 * 8192**3 / mm.median_ms / 1e9,
        "validate_one_config_ms": validate_ms,
        "copy_ms": copy.median_ms, "copy_gbps": 2 * 2 * (1 << 30) / copy.median_ms / 1e6,
        "retimed_all": [sorted(s)[1] for s in samples],
        "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--only", default="abc")
    args = ap.parse_args()
    from benchmarks import record
    from sweep.spec import load_spec

    # A partial run is recorded under its own name, beside the full one.
    result = record.header("gpu_sweep" if args.only == "abc" else f"gpu_sweep_{args.only}")
    result["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    base = yaml.safe_load((ROOT / "configs" / "matmul.yaml").read_text())
    space_a = load_spec(ROOT / "configs" / "matmul.yaml").expand()
    configs_a = [space_a.config(i) for i in range(len(space_a))]
    def save() -> None:  # after each part, so a run cut short still leaves its numbers
        record.write(result, args.out)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "a" in args.only:
            a = result["a"] = {}
            a["autotune_1gpu"] = autotune_baseline(configs_a, tmp / "cache-autotune")
            print("autotune", json.dumps(a["autotune_1gpu"]), flush=True)
            save()
            for gpus in (1, 2):
                spec = {**base, "run": {**base["run"], "workers": gpus}}
                a[f"sweep_{gpus}gpu"] = sweep(spec, tmp, f"a{gpus}", tmp / f"cache-a{gpus}")
                print(f"a {gpus} GPU", a[f"sweep_{gpus}gpu"]["sweep_s"], flush=True)
                save()
            for repeat in (2, 3):
                spec = {**base, "run": {**base["run"], "workers": 2}}
                a[f"sweep_2gpu_repeat{repeat}"] = sweep(spec, tmp, f"a2r{repeat}",
                                                        tmp / "cache-a2")
            ok = [r for r in a["sweep_2gpu"]["rows"] if r["status"] == "ok"]
            device = device_measurements([json.loads(r["config"]) for r in ok])
            device["retimed_indices"] = [r["index"] for r in ok]
            result["device"] = device
            print("device", {k: v for k, v in device.items()
                             if k not in ("retimed_all", "retimed_indices")}, flush=True)
            save()
        if "b" in args.only:
            b = result["b"] = {}
            for gpus in (1, 2):
                spec = {**SPEC_600, "run": {**SPEC_600["run"], "workers": gpus}}
                b[f"sweep_{gpus}gpu"] = sweep(spec, tmp, f"b{gpus}", tmp / f"cache-b{gpus}")
                print(f"b {gpus} GPU", b[f"sweep_{gpus}gpu"]["sweep_s"],
                      b[f"sweep_{gpus}gpu"]["counts"], flush=True)
                save()
        if "c" in args.only:
            soft = yaml.safe_load((ROOT / "configs" / "softmax.yaml").read_text())
            soft["problem"] = {"rows": 16384, "cols": 16384, "dtype": "float16"}
            soft["run"] = {"backend": "cuda", "workers": 2}
            result["c"] = sweep(soft, tmp, "softmax", tmp / "cache-c")
            print("c", result["c"]["sweep_s"], result["c"]["best"], flush=True)
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
