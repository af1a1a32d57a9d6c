"""The sweeps README and docs/ quote, timed as a user runs them: `sweep run` on the quickstart
(real kernels, Triton's CPU interpreter) and on the 10,000-config simulate spec, on the
local runtime (the default) and, as the baseline in the same run, on a private Ray
instance each command starts (`--runtime ray`, the default before the local runtime);
beside them `python -c "import torch, triton"`, the floor a kernel's sweep cannot go
under, and the quickstart answered by the best-config cache. Records the whole command's
wall time and the sweep's own (first dispatch to table written, from snapshot.json).

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


def timed_run(spec: str, out: Path, *extra: str, cache: str | None = None) -> dict:
    t0 = time.monotonic()
    # A cache of its own, empty: a new user's first run (a cached best would answer it).
    subprocess.run([sys.executable, "-m", "sweep", "run", spec, "--out", out, *extra],
                   cwd=ROOT, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
                                  "SWEEP_CACHE_DIR": cache or f"{out}-cache"},
                   check=True, capture_output=True)
    command_s = time.monotonic() - t0
    if not (out / "snapshot.json").exists():  # answered by the cache
        return {"command_s": command_s}
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    start = snap["timeline"]["session_start"]
    return {"command_s": command_s, "sweep_s": snap["written_at"] - snap["first_dispatch_at"],
            "trials": snap["done"], "state": snap["state"],
            # Seconds from the session's start to each phase (snapshot.json's timeline).
            "phases_s": {k: round(v - start, 3) for k, v in sorted(
                snap["timeline"].items(), key=lambda kv: kv[1])}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    result = {**record.header("readme_commands"), "specs": {}}
    imports = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-c", "import torch, triton"], check=True)
            imports.append(time.monotonic() - t0)
        result["import_torch_triton_s"] = {"runs": imports,
                                           "median": statistics.median(imports)}
        for spec in SPECS:
            for runtime in ("local", "ray"):
                runs = [timed_run(spec, Path(tmp) / f"{Path(spec).stem}-{runtime}-{i}",
                                  "--runtime", runtime) for i in range(args.repeats)]
                result["specs"][f"{spec} {runtime}"] = {
                    "runs": runs,
                    "median_command_s": statistics.median(r["command_s"] for r in runs),
                    "median_sweep_s": statistics.median(r["sweep_s"] for r in runs)}
                print(spec, runtime, json.dumps(result["specs"][f"{spec} {runtime}"]),
                      flush=True)
        first = Path(tmp) / "quickstart-local-0"
        cached = [timed_run(SPECS[0], Path(tmp) / f"cached-{i}", cache=f"{first}-cache")
                  for i in range(args.repeats)]
        result["quickstart_cached"] = {"runs": cached, "median_command_s": statistics.median(
            r["command_s"] for r in cached)}
        print("cached", json.dumps(result["quickstart_cached"]), flush=True)
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
