"""How long a sweep's compiles take on its compile processes, by the order they are handed
out in and whether configs at least as heavy as one a learnt limit stopped are compiled:
each recorded compile replayed on SLOTS processes as events (a compile holds a process for
its recorded time, or until the limit learnt from the compiles ended so far stops it).
The order is sweep.search.scheduling.compile_order's (at several heavy-lane shares) or the
one before it, heaviest first with the lightest between; the limit is actors/
compile_limit.py's, as each pool learns it; the rule is its Stopped. Offline, on tables
recorded on an H200; any machine. The compile processes alone: not the GPU, the driver's
batches or the processes' start.

Usage: python benchmarks/compile_schedule.py [--out FILE]
"""

from __future__ import annotations

import argparse
import heapq
import json
import platform
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actors.compile_limit import CACHE_HIT_MS, Stopped, learnt  # noqa: E402
from actors.protocol import CompileLimit, compile_weight  # noqa: E402
from sweep.search import scheduling  # noqa: E402
from sweep.spec import load_spec  # noqa: E402
from sweep.spec.space import Space, expand_configs  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SLOTS = 15  # an H200 host's 16 CPUs, one for the worker
FIXED_S = 60.0
SHARES = (0.2, 0.3, 0.5)
# (name, recorded table or run archive, spec of its space; None: the table's configs)
TABLES: list[tuple[str, str, str | None]] = [
    ("liger_rms_324 (recorded under a 60 s limit)",
     "heavy_compiles_diag_liger_rms-2026-12-03.parquet", None),
    ("liger_rms_324 (recorded under a learnt 5 s limit)",
     "heavy_compiles_key_runs/liger_rms.tar.gz", None),
    ("matmul_64", "heavy_compiles_key_runs/matmul_empty.tar.gz", None),
    ("matmul_shapes_544", "heavy_compiles_key_runs/shapes_empty.tar.gz",
     "configs/matmul-shapes.yaml"),
]


def read_rows(source: str) -> list[dict[str, Any]]:
    path = RESULTS / source
    if not source.endswith(".tar.gz"):
        return pq.read_table(path).to_pylist()
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(path) as tar:
        member = next(m for m in tar.getnames() if m.endswith("trials.parquet"))
        tar.extract(member, tmp, filter="data")
        return pq.read_table(Path(tmp) / member).to_pylist()


def heaviest_first(space: Space, todo: Sequence[int]) -> list[int]:
    """The order before lanes: the heaviest, the lightest, the second heaviest, ... (one
    problem's configs; ties by index)."""
    ranked = sorted(todo, key=lambda i: (-compile_weight(space.kernel_config(i)), i))
    order: list[int] = []
    for g in range((len(ranked) + 1) // 2):
        order.append(ranked[g])
        if len(ranked) - 1 - g > g:
            order.append(ranked[len(ranked) - 1 - g])
    return order


def replay(order: list[int], compile_s: dict[int, float], configs: dict[int, dict[str, Any]],
           latency: dict[int, float | None], rule: bool,
           problem_keys: Sequence[str]) -> dict[str, Any]:
    """Hand `order` out to SLOTS processes; stop a compile past the limit in force."""
    queue = list(order)
    running: dict[int, float] = {}  # key: when it started
    samples: list[float] = []
    limit = learnt(FIXED_S, samples)
    stopped = Stopped(problem_keys)
    now = busy = 0.0
    ruled_out: set[int] = set()
    counts = {"stopped": 0, "ruled_out": 0, "ruled_out_compiling_in_time": 0}
    while queue or running:
        while len(running) < SLOTS and queue:
            running[queue.pop(0)] = now
        ends = [(start + min(compile_s[k], limit.seconds), k) for k, start in running.items()]
        heapq.heapify(ends)
        now, key = ends[0]
        busy += now - running.pop(key)
        if compile_s[key] <= limit.seconds:
            if compile_s[key] * 1e3 >= CACHE_HIT_MS:
                samples.append(compile_s[key] * 1e3)
                limit = learnt(FIXED_S, samples)
            continue
        counts["stopped"] += 1
        if rule and stopped.add(key, configs[key], limit):
            kept = [k for k in queue if stopped.why(configs[k]) is None]
            out = set(queue) - set(kept)
            counts["ruled_out"] += len(out)
            # what the rule got wrong: compiles the limit would have let end
            counts["ruled_out_compiling_in_time"] += sum(compile_s[k] <= limit.seconds
                                                         for k in out)
            ruled_out |= out
            queue = kept
    ran = {k: ms for k, ms in latency.items() if ms is not None}
    best = min(ran, key=ran.__getitem__)
    return {"compile_wall_s": round(now, 2), "compile_s": round(busy, 1), **counts,
            "best_ruled_out": best in ruled_out}


def measure(name: str, source: str, spec: str | None) -> dict[str, Any]:
    rows = read_rows(source)
    if spec is None:
        rows.sort(key=lambda r: r["index"])
        space = expand_configs([json.loads(r["config"]) for r in rows], ())
        problem_keys: tuple[str, ...] = ()
    else:
        loaded = load_spec(ROOT / spec)
        space, problem_keys = loaded.expand(), loaded.problem_keys
    configs = {r["index"]: space.config(r["index"]) for r in rows}
    # A compile the limit stopped then would have gone on: it is never done here.
    compile_s = {r["index"]: float("inf") if CompileLimit.stopped(r["status"], r["error"])
                 else (r["compile_ms"] or 0.0) / 1e3 for r in rows}
    latency = {r["index"]: r["latency_ms"] if r["status"] == "ok" else None for r in rows}
    todo = sorted(configs)
    result: dict[str, Any] = {"table": source, "configs": len(rows)}
    if len(space.starts) == 1:
        result["heaviest_first"] = replay(heaviest_first(space, todo), compile_s, configs,
                                          latency, False, problem_keys)
    for share in SHARES:
        scheduling.HEAVY_SHARE = share
        order = scheduling.compile_order(space, todo)
        for rule in (False, True):
            result[f"lanes_{share:g}{'_rule' if rule else ''}"] = replay(
                order, compile_s, configs, latency, rule, problem_keys)
    print(name, json.dumps(result))
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    shipped = scheduling.HEAVY_SHARE
    out = {"date": date.today().isoformat(), "machine": platform.platform(),
           "python": platform.python_version(), "slots": SLOTS, "fixed_limit_s": FIXED_S,
           "heavy_share_shipped": shipped,
           "tables": {name: measure(name, source, spec) for name, source, spec in TABLES}}
    scheduling.HEAVY_SHARE = shipped
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
