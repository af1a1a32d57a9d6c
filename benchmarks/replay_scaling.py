"""Scheduling measured on recorded GPU data: the 600-config matmul table of an H200
(benchmarks/tables/) replayed through `sweep run` (the replay backend: the real driver, Ray
actors, workers and their scheduling; simulated GPUs and compile slots) on 1, 2, 4, 8 and
16 simulated GPUs with N compile slots each.

For each: the whole command, and the sweep's span from the first trial begun to the last
done (replayed seconds, i.e. divided by the time scale); the GPUs' idle time within it;
the efficiency, the lower bound over the span; and how long after the first simulated GPU
the last came up (Ray starting one actor process each, on this machine's CPUs). The lower
bound is the larger of the GPU work and the compile work spread perfectly over their
devices and slots, and the longest single config (its compile, then its trial).

Usage: python benchmarks/replay_scaling.py [--gpus 1,2,4,8,16] [--slots 15] [--scale 1]
       [--repeats 3]
Writes benchmarks/results/replay_scaling-DATE.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.time_to_answer import SPEC_600  # noqa: E402

TABLE = ROOT / "benchmarks" / "tables" / "matmul600-h200.parquet"


def lower_bound_s(table: Path, gpus: int, slots: int) -> float:
    rows = pq.read_table(table).to_pylist()
    compile_s = [(r["compile_ms"] or 0.0) / 1e3 for r in rows]
    gpu_s = [(r["finished_at"] - r["started_at"]).total_seconds()
             if r["status"] not in ("compile_error", "timeout") else 0.0 for r in rows]
    return max(sum(gpu_s) / gpus, sum(compile_s) / (gpus * slots),
               max(c + g for c, g in zip(compile_s, gpu_s)))


def replay(tmp: Path, gpus: int, slots: int, scale: float, table: Path, repeat: int) -> dict:
    spec = {**SPEC_600, "name": f"replay-{gpus}",
            "run": {"backend": "replay", "trial_timeout_s": 120, "finalists": 0},
            "replay": {"table": str(table), "workers": gpus, "compile_slots": slots,
                       "time_scale": scale}}
    spec_path = tmp / f"replay-{gpus}.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp / f"run-{gpus}-{repeat}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    launched = time.time()
    proc = subprocess.run([sys.executable, "-m", "sweep", "run", spec_path, "--out", out],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    command_s = time.time() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"replay on {gpus} failed:\n{proc.stdout}\n{proc.stderr}")
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    recorded = {r["config"]: r for r in pq.read_table(table).to_pylist()}
    assert all(r["status"] == recorded[r["config"]]["status"] for r in rows), "statuses differ"
    ran = [r for r in rows if r["status"] not in ("compile_error", "timeout")]
    first = min(r["started_at"].timestamp() for r in rows)
    last = max(r["finished_at"].timestamp() for r in rows)
    span = (last - first) / scale
    busy = sum((r["finished_at"] - r["started_at"]).total_seconds() for r in ran) / scale
    bound = lower_bound_s(table, gpus, slots)
    timeline = json.loads((out / "snapshot.json").read_text())["snapshot"]["timeline"]
    # Ray starts the simulated GPUs' actors one after another on a small machine: the
    # last may come up seconds after the first, which no scheduling can make up for.
    skew = timeline.get("all_workers_up", first) - timeline.get("first_worker_up", first)
    return {"gpus": gpus, "slots": slots, "command_s": command_s, "span_s": span,
            "workers_up_skew_s": skew,
            "lower_bound_s": bound, "efficiency": bound / span,
            "gpu_idle_s": gpus * span - busy, "gpu_busy_fraction": busy / (gpus * span),
            "counts": json.loads((out / "snapshot.json").read_text())["snapshot"]["counts"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="1,2,4,8,16")
    ap.add_argument("--slots", type=int, default=15, help="compile slots per GPU")
    ap.add_argument("--scale", type=float, default=1.0, help="replayed seconds x this")
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    from benchmarks import record

    result = record.header("replay_scaling")
    result.update(table=str(args.table.relative_to(ROOT)) if args.table.is_relative_to(ROOT)
                  else str(args.table), slots=args.slots, time_scale=args.scale, runs=[],
                  median_efficiency={})
    print(f"{'GPUs':>4} {'command s':>9} {'span s':>7} {'bound s':>7} {'eff':>5} "
          f"{'idle GPU-s':>10} {'up skew s':>9}")
    with tempfile.TemporaryDirectory() as tmp_name:
        for repeat in range(args.repeats):
            for gpus in (int(g) for g in args.gpus.split(",")):
                r = replay(Path(tmp_name), gpus, args.slots, args.scale, args.table, repeat)
                result["runs"].append(r)
                print(f"{gpus:>4} {r['command_s']:>9.1f} {r['span_s']:>7.2f} "
                      f"{r['lower_bound_s']:>7.2f} {r['efficiency']:>5.2f} "
                      f"{r['gpu_idle_s']:>10.2f} {r['workers_up_skew_s']:>9.2f}", flush=True)
    for gpus in sorted({r["gpus"] for r in result["runs"]}):
        effs = [r["efficiency"] for r in result["runs"] if r["gpus"] == gpus]
        result["median_efficiency"][gpus] = statistics.median(effs)
        print(f"{gpus} GPUs: median efficiency {statistics.median(effs):.2f} "
              f"(runs: {', '.join(f'{e:.2f}' for e in effs)})")
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
