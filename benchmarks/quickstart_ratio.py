"""The quickstart against the floor a user already pays: `sweep run configs/quickstart.yaml`
(a new run, empty best-config cache) and the same command again with another --out (the
cached answer), each as a ratio to `python -c "import torch, triton"` timed in the same
round, so that the machine's drift falls on all three alike. Targets (issue 36): the
quickstart at most 2.5x the import, its cached answer at most 0.5x.

Each round runs the import, the quickstart and its cached answer, the import first in even
rounds and last in odd ones; recorded are every run's wall time, each round's two ratios,
their medians, and each new run's phase timeline (snapshot.json), which says where the
quickstart's time goes.

Usage: python benchmarks/quickstart_ratio.py [--rounds 7] [--out benchmarks/results]
                                             [--name quickstart_ratio]
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

SPEC = "configs/quickstart.yaml"


def timed(argv: list[str], cache: Path) -> float:
    """One whole command from this checkout, its wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
           "SWEEP_CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.monotonic() - t0


def one_round(i: int, tmp: Path) -> dict[str, Any]:
    cache = tmp / f"cache-{i}"  # empty: the first sweep runs, the second is answered
    sweep = [sys.executable, "-m", "sweep", "run", SPEC, "--out"]
    got: dict[str, Any] = {}

    def imports() -> None:
        got["import_s"] = timed([sys.executable, "-c", "import torch, triton"], cache)

    if i % 2 == 0:
        imports()
    got["quickstart_s"] = timed([*sweep, str(tmp / f"run-{i}")], cache)
    got["cached_s"] = timed([*sweep, str(tmp / f"cached-{i}")], cache)
    if i % 2 == 1:
        imports()
    snapshot = json.loads((tmp / f"run-{i}" / "snapshot.json").read_text())
    got["timeline"] = snapshot.get("snapshot", {}).get("timeline")
    got["quickstart_ratio"] = got["quickstart_s"] / got["import_s"]
    got["cached_ratio"] = got["cached_s"] / got["import_s"]
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--name", default="quickstart_ratio",
                    help="the result's name (benchmarks/results/NAME-DATE.json)")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result: dict[str, Any] = {**record.header(args.name), "commit": commit, "spec": SPEC,
                              "targets": {"quickstart_ratio": 2.5, "cached_ratio": 0.5},
                              "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            result["rounds"].append(one_round(i, Path(tmp)))
            print(json.dumps({k: v for k, v in result["rounds"][-1].items()
                              if k != "timeline"}), flush=True)
    for key in ("import_s", "quickstart_s", "cached_s", "quickstart_ratio", "cached_ratio"):
        values = [r[key] for r in result["rounds"]]
        result[f"median_{key}"] = statistics.median(values)
        result[f"range_{key}"] = [min(values), max(values)]
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("median", "range"))}))
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
