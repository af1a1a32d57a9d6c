"""The search strategies confirmed on a GPU: the 1,800-config matmul space of
configs/matmul-1800.yaml, exhaustive against the guided search (and halving), each
`sweep run` with an empty Triton cache of its own, then every pick re-timed side by side
(interleaved, three rounds, the median of each) to see how far each is from the
exhaustive best on the same device at the same moment.

Reported per run: the whole command's time, the trials' span, GPU-seconds (each trial's
start on the device to its record), the configs compiled, and the pick.

Usage (on the GPU machine): python3 benchmarks/gpu_search.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402
from benchmarks.time_to_answer import command  # noqa: E402

SEARCHES = {"exhaustive": "exhaustive", "guided": {"strategy": "guided", "seed": 0},
            "halving": {"strategy": "halving", "seed": 0}}


def gpu_seconds(out: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "trials.parquet").to_pylist()
    ran = [r for r in rows if r["status"] != "pruned"]
    timed = [r for r in ran if r["status"] not in ("compile_error", "timeout")]
    first = min(r["started_at"] for r in ran)
    last = max(r["finished_at"] for r in ran)
    return {"ran": len(ran), "gpu_s": sum((r["finished_at"] - r["started_at"]).total_seconds()
                                          for r in timed),
            "compile_s": sum((r["compile_ms"] or 0.0) for r in ran) / 1e3,
            "span_s": (last - first).total_seconds()}


def retime(configs: list[dict], problem: dict) -> list[float]:
    """Each config's median over three interleaved rounds of do_bench(25, 100)."""
    import triton.testing

    from sweep_kernels.matmul import KERNEL

    inputs = KERNEL.make_inputs(problem, "cuda", 0)
    args, _ = KERNEL.launch_args(inputs, problem)
    launches = [(lambda c=c: KERNEL.fn[KERNEL.grid(problem, c)](*args, **c)) for c in configs]
    samples: list[list[float]] = [[] for _ in configs]
    for _ in range(3):
        for launch, got in zip(launches, samples):
            got.append(triton.testing.do_bench(launch, warmup=25, rep=100,
                                               return_mode="median"))
    return [sorted(s)[1] for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="exhaustive,guided,halving")
    args = parser.parse_args()
    base = yaml.safe_load((ROOT / "configs" / "matmul-1800.yaml").read_text())
    result = record.header("gpu_search")
    result["runs"] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-search-") as tmp:
        t = Path(tmp)
        for name in args.only.split(","):
            spec = {**base, "name": f"mm1800-{name}", "search": SEARCHES[name]}
            # An empty Triton cache each: no run compiles faster for another's compiles;
            # an empty best-config cache each: no warm start from another's picks.
            run = command(spec, t, name, t / f"triton-{name}", env_extra={
                "SWEEP_PRESTART": "0", "SWEEP_CACHE_DIR": str(t / f"best-{name}")})
            run.update(gpu_seconds(Path(run["out"])))
            del run["out"]
            result["runs"][name] = run
            print(json.dumps({k: run[k] for k in ("name", "command_s", "ran", "gpu_s",
                                                  "span_s", "best")}), flush=True)
        picks = {name: r["best"]["config"] for name, r in result["runs"].items()}
        times = retime(list(picks.values()), base["problem"])
        result["picks_retimed_ms"] = dict(zip(picks, times))
        if "exhaustive" in picks:
            ref = result["picks_retimed_ms"]["exhaustive"]
            result["picks_over_exhaustive"] = {k: v / ref - 1 for k, v in
                                               result["picks_retimed_ms"].items()}
    print(json.dumps({k: v for k, v in result.items() if k.startswith("picks")}, indent=1))
    print(record.write(result, args.out))


if __name__ == "__main__":
    main()
