"""Search strategies measured on recorded GPU tables (benchmarks/tables/): what each
strategy compiles and times, the GPU time that costs, and how far its pick is from the
exhaustive best.

(a) Decisions, over seeds 0-9: a strategy's proposals depend only on the outcomes of what
    it ran (sweep/search/strategies.py), so the recorded table decides them exactly as a run would.
    For each table and strategy: the fraction of the space compiled and timed, the
    recorded GPU-seconds and compile-seconds of those configs against all of them, and
    the pick's latency over the exhaustive best (replay's re-timing gives the recorded
    latency back, so the pick is the fastest config run; for halving, of its sample).
(b) Runs: `sweep run` with the replay backend (the real driver, Ray actors and workers on
    simulated GPUs and compile slots), exhaustive against guided and halving on one GPU
    with 15 compile slots (the H200 box), and guided on 8: the whole command's time, the
    sweep's span, each GPU's busy share (from its first trial to its last), and whether
    the run ran exactly the configs (a) decided.
(c) 8 simulated GPUs (the simulate backend: no compiles, 20 ms a trial) on a space like
    (b)'s, exhaustive against guided: each GPU's busy share, from its first trial to its
    last, is what the search's decisions and batches leave of it.

(w) Warm start: (a)'s guided search of the 1,800-config space started from the top 8 of
    the 600-config table (the same problem, another space), against starting cold.

Usage: python benchmarks/search.py [--only awbc] [--scale 1.0] [--out DIR]
Writes benchmarks/results/search-DATE.json and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402
from sweep.search.strategies import Search, batch_size, strategy  # noqa: E402
from sweep.search.warm_start import indices_of  # noqa: E402
from sweep.spec import load_spec  # noqa: E402
from sweep.spec.search_options import SearchOptions  # noqa: E402

TABLES = ROOT / "benchmarks" / "tables"
# Each recorded table and the spec that recorded it (the replay reads the table's rows by
# config, so the space must be the recording's).
CASES = {
    "matmul-1800": ("configs/matmul-1800.yaml", "matmul1800-h200.parquet"),
    "matmul-600": ("configs/replay-600.yaml", "matmul600-h200.parquet"),
    "softmax-114": ("configs/softmax.yaml", "softmax-h200.parquet"),
}
SEEDS = range(10)
SLOTS = 15  # compile processes per GPU on the H200 box (16 cores)


def spec_doc(case: str, search: dict[str, Any] | str, gpus: int, scale: float) -> dict:
    path, table = CASES[case]
    doc = yaml.safe_load((ROOT / path).read_text())
    doc.update(name=f"{case}-{gpus}", search=search,
               run={"backend": "replay", "trial_timeout_s": 120},
               replay={"table": str(TABLES / table), "workers": gpus,
                       "compile_slots": SLOTS, "time_scale": scale})
    return doc


def recorded(table: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for r in pq.read_table(table).to_pylist():
        gpu = 0.0 if r["status"] in ("compile_error", "timeout") else \
            (r["finished_at"] - r["started_at"]).total_seconds()
        out[r["config"]] = {"latency_ms": r["latency_ms"] if r["status"] == "ok" else None,
                            "gpu_s": gpu, "compile_s": (r["compile_ms"] or 0.0) / 1e3}
    return out


def decide(case: str, options: SearchOptions, gpus: int,
           warm_from: str | None = None) -> dict[str, Any]:
    """A strategy's decisions from the recorded table alone; warm_from: another case
    whose top configs (by its recorded one pass) the search starts with."""
    path, table = CASES[case]
    spec = load_spec(ROOT / path, import_kernel=False)
    space = spec.expand()
    rows = recorded(TABLES / table)
    truth = [rows[space.config_json(i)] for i in range(len(space))]
    warm: list[int] = []
    if warm_from is not None:
        theirs = sorted((r for r in recorded(TABLES / CASES[warm_from][1]).items()
                         if r[1]["latency_ms"] is not None), key=lambda r: r[1]["latency_ms"])
        warm = indices_of(space, [json.loads(c) for c, _ in theirs[:options.warm_start]])
    search = Search(strategy(space, options, batch_size(options, gpus, SLOTS), warm), {})
    queue = search.advance()
    while queue:
        for i in queue:
            search.known[i] = truth[i]["latency_ms"]
        queue = search.advance()
    ran = sorted(search.known)
    best = min(t["latency_ms"] for t in truth if t["latency_ms"] is not None)
    # How many configs ran (in batch order) before one within 2% of the best had.
    order = [i for batch in search.batches for i in batch]
    to_2pct = next((k + 1 for k, i in enumerate(order) if truth[i]["latency_ms"] is not None
                    and truth[i]["latency_ms"] <= 1.02 * best), None)
    pick = min((truth[i]["latency_ms"] for i in ran if truth[i]["latency_ms"] is not None),
               default=math.inf)
    return {"seed": options.seed, "ran": len(ran), "fraction": len(ran) / len(space),
            "gpu_s": sum(truth[i]["gpu_s"] for i in ran),
            "compile_s": sum(truth[i]["compile_s"] for i in ran),
            "pick_ms": pick, "over_best": pick / best - 1, "configs_to_2pct": to_2pct,
            "indices": ran}


def decisions(gpus: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, (_, table) in CASES.items():
        rows = recorded(TABLES / table)
        total = {"configs": len(rows), "gpu_s": sum(r["gpu_s"] for r in rows.values()),
                 "compile_s": sum(r["compile_s"] for r in rows.values()),
                 "best_ms": min(r["latency_ms"] for r in rows.values()
                                if r["latency_ms"] is not None)}
        out[case] = {"exhaustive": total}
        for name in ("guided", "halving"):
            runs = [decide(case, SearchOptions(name, seed=s), gpus) for s in SEEDS]
            for r in runs:
                del r["indices"]
            out[case][name] = {
                "seeds": runs,
                "within_2pct": sum(r["over_best"] <= 0.02 for r in runs),
                "median_fraction": statistics.median(r["fraction"] for r in runs),
                "max_fraction": max(r["fraction"] for r in runs),
                "gpu_s_ratio": total["gpu_s"] / statistics.median(r["gpu_s"] for r in runs),
                "compile_s_ratio": total["compile_s"] / statistics.median(
                    r["compile_s"] for r in runs),
                "worst_over_best": max(r["over_best"] for r in runs)}
    return out


def warm_decisions() -> dict[str, Any]:
    """The 1,800-config space's guided search started from the 600-config space's top 8
    configs (the same problem, another space: as a sweep of a nearby space would be
    cached), against starting cold, 1 GPU's batches."""
    out: dict[str, Any] = {}
    for label, source in (("cold", None), ("warm_from_600", "matmul-600")):
        runs = [decide("matmul-1800", SearchOptions("guided", seed=s), 1, source)
                for s in SEEDS]
        out[label] = {"within_2pct": sum(r["over_best"] <= 0.02 for r in runs),
                      "median_fraction": statistics.median(r["fraction"] for r in runs),
                      "median_configs_to_2pct": statistics.median(
                          r["configs_to_2pct"] or math.inf for r in runs),
                      "seeds": [{k: v for k, v in r.items() if k != "indices"} for r in runs]}
    return out


def busy_shares(rows: list[dict[str, Any]], scale: float) -> dict[str, float]:
    """Each simulated GPU's busy share from its first trial's start to its last's end."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["status"] not in ("pruned", "compile_error", "timeout"):
            by.setdefault(r["worker"], []).append(r)
    out = {}
    for worker, mine in sorted(by.items()):
        span = max(r["finished_at"] for r in mine) - min(r["started_at"] for r in mine)
        held = sum((r["finished_at"] - r["started_at"]).total_seconds() for r in mine)
        out[worker] = held / max(span.total_seconds(), 1e-9)
    return out


def run(tmp: Path, case: str, search: dict[str, Any] | str, gpus: int, scale: float,
        label: str) -> dict[str, Any]:
    spec_path = tmp / f"{label}.yaml"
    spec_path.write_text(yaml.safe_dump(spec_doc(case, search, gpus, scale), sort_keys=False))
    out = tmp / label
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local",
           "SWEEP_CACHE_DIR": str(tmp / f"cache-{label}")}  # no warm start from another run
    launched = time.time()
    proc = subprocess.run([sys.executable, "-m", "sweep", "run", spec_path, "--out", out],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=1200)
    command_s = time.time() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{proc.stdout}\n{proc.stderr}")
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    ran = [r for r in rows if r["status"] != "pruned"]
    tried = [r for r in ran if r["status"] not in ("compile_error", "timeout")]
    first = min(r["started_at"].timestamp() for r in ran)
    last = max(r["finished_at"].timestamp() for r in ran)
    best = json.loads((out / "best.json").read_text())
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    shares = busy_shares(rows, scale)
    return {"label": label, "case": case, "search": search, "gpus": gpus, "scale": scale,
            "command_s": command_s, "span_s": (last - first) / scale,
            "finished_s": (snap["timeline"].get("finalists_done", last) - launched),
            "ran": len(ran), "fraction": len(ran) / len(rows),
            "gpu_s": sum((r["finished_at"] - r["started_at"]).total_seconds()
                         for r in tried) / scale,
            "pick_index": best["index"], "pick_ms": best["latency_ms"],
            "busy_min": min(shares.values()), "busy": shares,
            "indices": sorted(r["index"] for r in ran), "counts": snap["counts"]}


def runs(scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="search-bench-") as tmp:
        t = Path(tmp)
        for label, search, gpus, s in (
                ("exhaustive-1gpu", "exhaustive", 1, scale),
                ("guided-1gpu", {"strategy": "guided", "seed": 0}, 1, scale),
                ("halving-1gpu", {"strategy": "halving", "seed": 0}, 1, scale),
                ("exhaustive-8gpu", "exhaustive", 8, 1.0),
                ("guided-8gpu", {"strategy": "guided", "seed": 0}, 8, 1.0)):
            r = run(t, "matmul-1800", search, gpus, s, label)
            if search != "exhaustive":
                options = SearchOptions(**search) if isinstance(search, dict) else None
                assert options is not None
                r["same_as_decided"] = r["indices"] == decide("matmul-1800", options,
                                                              gpus)["indices"]
            del r["indices"]
            out[label] = r
            print(json.dumps({k: v for k, v in r.items() if k != "busy"}), flush=True)
    return out


SIM_SPACE = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256],
             "BLOCK_K": [32, 64, 128], "GROUP_M": [1, 8], "num_warps": [2, 4, 8],
             "num_stages": [2, 3, 4, 5]}


def simulated(trial_ms: float) -> dict[str, Any]:
    """8 simulated GPUs with no compile to wait on: the GPUs themselves are the limit, so
    any time between a GPU's trials is the search's (its decisions, its batches)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="search-sim-") as tmp:
        t = Path(tmp)
        for label, search in (("exhaustive", "exhaustive"),
                              ("guided", {"strategy": "guided", "seed": 0})):
            doc = {"name": f"sim8-{label}", "kernel": "matmul", "space": SIM_SPACE,
                   "search": search, "run": {"backend": "simulate", "finalists": 5},
                   "simulate": {"workers": 8, "trial_ms": trial_ms}}
            spec_path = t / f"{label}.yaml"
            spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local",
                   "SWEEP_CACHE_DIR": str(t / f"cache-{label}")}
            launched = time.time()
            proc = subprocess.run([sys.executable, "-m", "sweep", "run", spec_path, "--out",
                                   t / label], cwd=t, env=env, capture_output=True,
                                  text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"{label} failed:\n{proc.stdout}\n{proc.stderr}")
            rows = pq.read_table(t / label / "trials.parquet").to_pylist()
            shares = busy_shares(rows, 1.0)
            best = json.loads((t / label / "best.json").read_text())
            out[label] = {"command_s": time.time() - launched, "trial_ms": trial_ms,
                          "ran": sum(r["status"] != "pruned" for r in rows),
                          "busy_min": min(shares.values()), "busy": shares,
                          "pick_ms": best["latency_ms"]}
            print(json.dumps({k: v for k, v in out[label].items() if k != "busy"}),
                  flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="awbc")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    result = record.header("search")
    if "a" in args.only:
        result["decisions_1gpu"] = decisions(1)
        result["decisions_8gpu"] = decisions(8)
        for gpus in (1, 8):
            for case, by in result[f"decisions_{gpus}gpu"].items():
                for name in ("guided", "halving"):
                    s = by[name]
                    print(f"{gpus} GPU {case:12} {name:8} within 2%: {s['within_2pct']}/10, "
                          f"ran median {s['median_fraction']:.1%} (max {s['max_fraction']:.1%})"
                          f", GPU time {s['gpu_s_ratio']:.1f}x less, compile "
                          f"{s['compile_s_ratio']:.1f}x less, worst "
                          f"+{s['worst_over_best']:.1%}")
    if "b" in args.only:
        result["runs"] = runs(args.scale)
    if "w" in args.only:
        result["warm_start"] = warm_decisions()
        for label, w in result["warm_start"].items():
            print(f"1 GPU matmul-1800  guided {label:14} within 2%: {w['within_2pct']}/10, "
                  f"ran median {w['median_fraction']:.1%}, within 2% after a median "
                  f"{w['median_configs_to_2pct']} configs")
    if "c" in args.only:
        result["simulated_8gpu"] = simulated(20.0)
    print(record.write(result, args.out))


if __name__ == "__main__":
    main()
