"""A change to how `sweep run` starts, paired against the commit before it in one call.

Each round runs the same command from this checkout (`head`) and from a checkout of the
baseline (`--base DIR`, its packages only), in turn, alternating which goes first, each
the whole command's wall clock: the matmul of configs/matmul.yaml with Triton's cache
warm (`--force`, the cache filled once by each before the rounds), and, with
`--empty N`, N rounds with an empty cache. For each run: the command's seconds, and from
its trace (actors/trace.py) and snapshot when its launcher's interpreter started, when
its launcher had imported torch and the kernel, its first and last trial and the
finalists' end (seconds since launch). The host's own times vary between calls by more
than a second (BENCHMARKS.md); a ratio within one call is what this measures.

Usage (on the GPU machine): python3 benchmarks/paired_start.py --base DIR --out DIR
    [--rounds 5] [--empty 2] [--commit SHA] [--base-commit SHA]
Writes OUT/paired_start-DATE.json after each run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.heavy_compiles import versions  # noqa: E402
from benchmarks.third_party import commit  # noqa: E402

MOMENTS = ("spare_started", "launcher_started", "launcher_imported", "launcher_warmed_up",
           "fork_server_prepared")


def run(root: Path, cache: Path, work: Path) -> dict[str, Any]:
    """One whole `sweep run configs/matmul.yaml --force` of the code at root."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    trace = work / "trace.jsonl"
    env = {**os.environ, "PYTHONPATH": str(root), "TRITON_CACHE_DIR": str(cache),
           "SWEEP_TRACE": str(trace)}
    launched = time.time()
    proc = subprocess.run([sys.executable, "-m", "sweep", "run",
                           str(root / "configs" / "matmul.yaml"), "--out", str(work / "run"),
                           "--force"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    entry: dict[str, Any] = {"rc": proc.returncode, "command_s": time.time() - launched}
    if proc.returncode != 0:
        entry["stderr_tail"] = proc.stderr[-2000:]
    first: dict[str, float] = {}
    if trace.exists():
        for line in trace.read_text().splitlines():
            event = json.loads(line)
            if event["event"] in MOMENTS:
                first.setdefault(event["event"], event["t"] - launched)
    snapshot = work / "run" / "snapshot.json"
    if snapshot.exists():
        timeline = json.loads(snapshot.read_text())["snapshot"].get("timeline") or {}
        first.update({k: v - launched for k, v in timeline.items()})
    entry["moments_s"] = dict(sorted(first.items(), key=lambda kv: kv[1]))
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--empty", type=int, default=0)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--base-commit", default=None)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    roots = {"head": ROOT, "base": args.base.resolve()}
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "commit": commit(args.commit),
        "base_commit": args.base_commit, "versions": versions(),
        "hardware": {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                     else "none", "cpus": os.cpu_count()},
        "warm": {name: [] for name in roots}, "empty": {name: [] for name in roots}}
    path = args.out / f"paired_start-{result['date']}.json"
    tmp = Path(tempfile.mkdtemp(prefix="paired-"))
    caches = {name: tmp / f"cache-{name}" for name in roots}
    for name, root in roots.items():  # each fills its own warm cache once
        result.setdefault("fill", {})[name] = run(root, caches[name], tmp / "work")
    for kind, rounds in (("warm", args.rounds), ("empty", args.empty)):
        for k in range(rounds):
            order = list(roots.items()) if k % 2 == 0 else list(roots.items())[::-1]
            for name, root in order:
                cache = caches[name] if kind == "warm" else tmp / f"empty-{name}-{k}"
                entry = run(root, cache, tmp / "work")
                result[kind][name].append(entry)
                print(kind, k, name, round(entry["command_s"], 2), entry["rc"], flush=True)
                path.write_text(json.dumps(result, indent=1))
    summary = {}
    for kind in ("warm", "empty"):
        med = {name: statistics.median(e["command_s"] for e in runs)
               for name, runs in result[kind].items() if runs}
        if len(med) == 2:
            summary[kind] = {"median_s": med, "head_over_base": med["head"] / med["base"]}
    result["summary"] = summary
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
