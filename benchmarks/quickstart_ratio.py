"""The quickstart against the floor a user already pays: `sweep run configs/quickstart.yaml`
(a new run, empty best-config cache) and the same command again with another --out (the
cached answer), each as a ratio to `python -c "import torch, triton"` timed in the same
round, so that the machine's drift falls on all three alike. Targets (issue 36): the
quickstart at most 2.5x the import, its cached answer at most 0.5x.

Each round runs the import, the quickstart and its cached answer, the import first in even
rounds and last in odd ones; with --baseline DIR (a checkout of the code before a change,
such as `git archive COMMIT | tar -x -C DIR`), the baseline's quickstart and cached answer
too, in the same round, this checkout's first in even rounds. Recorded are every run's wall
time, each round's ratios, their medians, and each new run's phase timeline
(snapshot.json), which says where the quickstart's time goes.

Usage: python benchmarks/quickstart_ratio.py [--rounds 7] [--baseline DIR]
                                             [--out benchmarks/results] [--name quickstart_ratio]
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


def timed(argv: list[str], cache: Path, checkout: Path = ROOT) -> float:
    """One whole command from a checkout's own packages (first on its path), its wall
    time."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "RAY_USAGE_STATS_ENABLED": "0",
           "SWEEP_CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    subprocess.run(argv, cwd=checkout, env=env, check=True, capture_output=True)
    return time.monotonic() - t0


def sweeps(checkout: Path, tag: str, i: int, tmp: Path, got: dict[str, Any]) -> None:
    """The quickstart (an empty best-config cache) and its cached answer, from checkout."""
    cache = tmp / f"{tag}cache-{i}"
    sweep = [sys.executable, "-m", "sweep", "run", SPEC, "--out"]
    got[f"{tag}quickstart_s"] = timed([*sweep, str(tmp / f"{tag}run-{i}")], cache, checkout)
    got[f"{tag}cached_s"] = timed([*sweep, str(tmp / f"{tag}cached-{i}")], cache, checkout)
    snapshot = json.loads((tmp / f"{tag}run-{i}" / "snapshot.json").read_text())
    got[f"{tag}timeline"] = snapshot.get("snapshot", {}).get("timeline")


def one_round(i: int, tmp: Path, baseline: Path | None) -> dict[str, Any]:
    got: dict[str, Any] = {}
    order = [(ROOT, "")] + ([(baseline, "baseline_")] if baseline else [])
    if i % 2 == 0:
        got["import_s"] = timed([sys.executable, "-c", "import torch, triton"], tmp)
    for checkout, tag in order if i % 2 == 0 else reversed(order):
        sweeps(checkout, tag, i, tmp, got)
    if i % 2 == 1:
        got["import_s"] = timed([sys.executable, "-c", "import torch, triton"], tmp)
    for _, tag in order:
        got[f"{tag}quickstart_ratio"] = got[f"{tag}quickstart_s"] / got["import_s"]
        got[f"{tag}cached_ratio"] = got[f"{tag}cached_s"] / got["import_s"]
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--name", default="quickstart_ratio",
                    help="the result's name (benchmarks/results/NAME-DATE.json)")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result: dict[str, Any] = {**record.header(args.name), "commit": commit, "spec": SPEC,
                              "targets": {"quickstart_ratio": 2.5, "cached_ratio": 0.5},
                              "baseline": str(args.baseline) if args.baseline else None,
                              "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            result["rounds"].append(one_round(i, Path(tmp), args.baseline))
            print(json.dumps({k: v for k, v in result["rounds"][-1].items()
                              if not k.endswith("timeline")}), flush=True)
    for key in result["rounds"][0]:
        if key.endswith("timeline"):
            continue
        values = [r[key] for r in result["rounds"]]
        result[f"median_{key}"] = statistics.median(values)
        result[f"range_{key}"] = [min(values), max(values)]
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("median", "range"))}))
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
