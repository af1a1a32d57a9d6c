"""The sweeps README quotes, timed as a user runs them: `sweep run` on the quickstart
(real kernels, Triton's CPU interpreter) and on the 10,000-config simulate spec, each
starting its own local Ray instance. Records the whole command's wall time and the sweep's
own (first dispatch to table written, from snapshot.json).

Usage: python benchmarks/readme_commands.py [--repeats 3] [--out benchmarks/results]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

SPECS = ("configs/quickstart.yaml", "configs/simulate-10k.yaml")


def timed_run(spec: str, out: Path) -> dict:
    t0 = time.monotonic()
    # A cache of its own, empty: a new user's first run (a cached best would answer it).
    subprocess.run([sys.executable, "-m", "sweep", "run", spec, "--out", out], cwd=ROOT,
                   env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
                        "SWEEP_CACHE_DIR": f"{out}-cache"}, check=True, capture_output=True)
    command_s = time.monotonic() - t0
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    return {"command_s": command_s, "sweep_s": snap["written_at"] - snap["first_dispatch_at"],
            "trials": snap["done"], "state": snap["state"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    result = {**record.header("readme_commands"), "specs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in SPECS:
            runs = [timed_run(spec, Path(tmp) / f"{Path(spec).stem}-{i}")
                    for i in range(args.repeats)]
            result["specs"][spec] = {
                "runs": runs,
                "median_command_s": statistics.median(r["command_s"] for r in runs),
                "median_sweep_s": statistics.median(r["sweep_s"] for r in runs)}
            print(spec, json.dumps(result["specs"][spec]), flush=True)
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
