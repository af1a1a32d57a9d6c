"""How many trials a second the driver moves, and how it scales with workers, with the
simulate backend against an already running local Ray instance (so Ray's start-up is out).

trial_ms 0: pure driver cost per trial (queue, Ray streaming, journal group commit).
trial_ms 20: simulated GPUs; ideal throughput is workers * 50 trials/s, and the ratio
of measured to ideal is the parallel efficiency the driver allows at that worker count.
The time is from the first dispatch to the table written (snapshot.json records both);
the whole command's time (joining the running cluster included) is recorded beside it.
Since 2026-12-01 a worker gets work as soon as it is up rather than once all are, so the
first dispatch comes earlier and the span includes the other workers' start-up.

Usage: python benchmarks/driver_throughput.py [--out benchmarks/results] [--name NAME]
(--name: the result's name, e.g. for a baseline run from another checkout)
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

from benchmarks import record  # noqa: E402

ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
ADDRESS = "127.0.0.1:6392"


def one(tmp: Path, workers: int, trial_ms: float, trials: int, tag: str = "") -> dict:
    name = f"w{workers}-t{trial_ms:g}{tag}"
    spec = tmp / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "kernel": "matmul", "space": {"A": list(range(trials))},
        "run": {"backend": "simulate", "finalists": 0},
        "simulate": {"workers": workers, "trial_ms": trial_ms}}))
    out = tmp / name
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sweep.cli", "run", spec, "--out", out,
                           "--address", ADDRESS], cwd=ROOT, env=ENV, capture_output=True,
                          text=True)
    command_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    seconds = snap["written_at"] - snap["first_dispatch_at"]
    rate = trials / seconds
    ideal = workers * 1000 / trial_ms if trial_ms else None
    return {"workers": workers, "trial_ms": trial_ms, "trials": trials, "seconds": seconds,
            "command_s": command_s,
            "trials_per_s": rate, "efficiency": rate / ideal if ideal else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--name", default="driver_throughput")
    args = ap.parse_args()
    ray_cli = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray_cli, "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
                    ADDRESS.split(":")[1], "--num-cpus", "2", "--include-dashboard", "false",
                    "--disable-usage-stats"], env=ENV, check=True, capture_output=True)
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            one(tmp, 2, 0, 200, "-warm")  # warm the cluster's worker pool, as a live cluster is
            for workers in (1, 2, 4, 8):
                runs.append(one(tmp, workers, 0, 20_000))
                print(json.dumps(runs[-1]), flush=True)
            for workers in (1, 2, 4, 8, 16):
                runs.append(one(tmp, workers, 20, 250 * workers))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=ENV, capture_output=True)
    result = {**record.header(args.name), "commit": commit(), "runs": runs}
    print(f"written {record.write(result, args.out)}")


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           text=True, capture_output=True).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


if __name__ == "__main__":
    main()
