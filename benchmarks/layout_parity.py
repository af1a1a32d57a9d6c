"""A restructuring must change no figure: the commands README quotes, timed whole from this
checkout and from a baseline checkout of the code before it (`--baseline DIR`, such as a
`git worktree add DIR COMMIT`), in turns, so that the machine's drift falls on both alike.

Each pair runs the same command from either checkout: the quickstart (real kernels on
Triton's interpreter), the 10,000-config simulate spec, and the quickstart answered by the
best-config cache, all on the local runtime (the default). Recorded: every run's wall time,
and per command the median of the pairs' ratios (this checkout / baseline), where 1.00 is
no change.

Usage: python benchmarks/layout_parity.py --baseline DIR [--pairs 5] [--out benchmarks/results]
                                          [--name layout_parity]
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

COMMANDS = {
    "quickstart": ("configs/quickstart.yaml", False),
    "simulate-10k": ("configs/simulate-10k.yaml", False),
    "quickstart, cached": ("configs/quickstart.yaml", True),
}


def timed(checkout: Path, spec: str, out: Path, cache: Path) -> float:
    """One `sweep run` from this checkout's own packages (first on its path), its whole
    wall time."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "RAY_USAGE_STATS_ENABLED": "0",
           "SWEEP_CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "sweep", "run", spec, "--out", str(out)],
                   cwd=checkout, env=env, check=True, capture_output=True)
    return time.monotonic() - t0


def pairs(name: str, spec: str, cached: bool, baseline: Path, n: int,
          tmp: Path) -> dict[str, object]:
    """n pairs of runs, this checkout first in even pairs and second in odd ones."""
    runs: dict[str, list[float]] = {"this": [], "baseline": []}
    for i in range(n):
        order = [("this", ROOT), ("baseline", baseline)]
        for which, checkout in order if i % 2 == 0 else reversed(order):
            cache = tmp / f"{which}-cache" if cached else tmp / f"{which}-{name}-{i}-cache"
            if cached and not cache.exists():  # the first run fills the cache it answers
                timed(checkout, spec, tmp / f"{which}-fill", cache)
            runs[which].append(timed(checkout, spec, tmp / f"{which}-{name}-{i}", cache))
    ratios = [a / b for a, b in zip(runs["this"], runs["baseline"])]
    return {"spec": spec, "cached": cached, "runs_s": runs,
            "median_s": {k: statistics.median(v) for k, v in runs.items()},
            "ratios": ratios, "median_ratio": statistics.median(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--name", default="layout_parity",
                    help="the result's name (benchmarks/results/NAME-DATE.json)")
    args = ap.parse_args()
    baseline = args.baseline.resolve()
    result = {**record.header(args.name), "commit": subprocess.run(
                  ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                  text=True).stdout.strip(), "baseline": str(baseline),
              "baseline_commit": subprocess.run(
                  ["git", "-C", str(baseline), "rev-parse", "HEAD"], capture_output=True,
                  text=True).stdout.strip(), "commands": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (spec, cached) in COMMANDS.items():
            result["commands"][name] = pairs(name, spec, cached, baseline, args.pairs,
                                             Path(tmp))
            print(name, json.dumps(result["commands"][name]), flush=True)
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
