"""A search on a space too small to search: configs/matmul.yaml's 64 configs (8192^3
bfloat16), replayed from a recorded H200 table, before and after the rule that runs every
config where a search's budget ends within its first sample (strategies.searches).

The table (benchmarks/tables/matmul64-h200.parquet) is made here from the one-GPU sweep
of those 64 configs that benchmarks/gpu_sweep.py recorded on an H200 (case (a),
results/gpu_sweep-2026-11-30.json: every config's one-pass latency, compile time and
timestamps; it kept no p20/p80, so both are the latency).

For seeds 0-9 and guided and halving with their default options on one GPU's batches (15
compile slots): the configs run and the pick's latency over the table's best, "before"
the strategy as it stands alone (Guided, Halving) and "after" as a run gets it
(strategies.strategy). Decisions only: replay's re-timing gives the recorded latency
back, so a pick is the fastest config run (for halving, the fastest of its sample).

Usage: python benchmarks/small_space.py [--out DIR]
Writes benchmarks/results/small_space-DATE.json and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402
from sweep.search.strategies import (  # noqa: E402
    Guided,
    Halving,
    Search,
    Strategy,
    batch_size,
    strategy,
)
from sweep.spec import load_spec  # noqa: E402
from sweep.spec.search_options import SearchOptions  # noqa: E402
from sweep.spec.space import Space  # noqa: E402

SPEC = ROOT / "configs" / "matmul.yaml"
TABLE = ROOT / "benchmarks" / "tables" / "matmul64-h200.parquet"
RECORDING = ROOT / "benchmarks" / "results" / "gpu_sweep-2026-11-30.json"
SEEDS = range(10)
SLOTS = 15  # compile processes per GPU on the H200 box (16 cores)
PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def make_table(space: Space) -> None:
    """The recorded one-GPU sweep's rows as a trial table the replay backend reads."""
    result = json.loads(RECORDING.read_text())
    rows = {r["config"]: r for r in result["a"]["sweep_1gpu"]["rows"]}
    out = []
    for i in range(len(space)):
        r = rows[space.config_json(i)]
        config = json.loads(r["config"])
        out.append({"index": i, **{p: config[p] for p in PARAMS}, "config": r["config"],
                    "status": r["status"], "latency_ms": r["latency_ms"],
                    "latency_p20_ms": r["latency_ms"], "latency_p80_ms": r["latency_ms"],
                    "validation": "passed", "error": None, "compile_ms": r["compile_ms"],
                    "device": "NVIDIA H200", "node": "vm", "worker": r["worker"],
                    "attempt": 1,
                    "started_at": datetime.fromtimestamp(r["started_at"], timezone.utc),
                    "finished_at": datetime.fromtimestamp(r["finished_at"], timezone.utc)})
    schema = pa.schema([(p, pa.int64()) for p in ("index", *PARAMS)] + [
        ("config", pa.string()), ("status", pa.string()), ("latency_ms", pa.float64()),
        ("latency_p20_ms", pa.float64()), ("latency_p80_ms", pa.float64()),
        ("validation", pa.string()), ("error", pa.string()), ("compile_ms", pa.float64()),
        ("device", pa.string()), ("node", pa.string()), ("worker", pa.string()),
        ("attempt", pa.int32()), ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC"))],
        metadata={"replay_provenance": "configs/matmul.yaml's 64 configs, one H200: "
                  "benchmarks/gpu_sweep.py (a) sweep_1gpu, "
                  "results/gpu_sweep-2026-11-30.json (benchmarks/small_space.py)"})
    pq.write_table(pa.Table.from_pylist(out, schema=schema), TABLE)


def replayed(search_of: Strategy, truth: list[float | None]) -> list[int]:
    """The configs a strategy runs, each outcome read from the table."""
    search = Search(search_of, {})
    queue = search.advance()
    while queue:
        for i in queue:
            search.known[i] = truth[i]
        queue = search.advance()
    return sorted(search.known)


def seeds(space: Space, truth: list[float | None], name: str, after: bool) -> dict[str, Any]:
    best = min(t for t in truth if t is not None)
    runs = []
    for seed in SEEDS:
        options = SearchOptions(name, seed=seed)
        batch = batch_size(options, 1, SLOTS)
        alone: Strategy = Guided(space, options, batch) if name == "guided" else \
            Halving(space, options)
        ran = replayed(strategy(space, options, batch) if after else alone, truth)
        pick = min(v for i in ran if (v := truth[i]) is not None)
        runs.append({"seed": seed, "ran": len(ran), "pick_ms": pick,
                     "over_best": pick / best - 1})
    return {"seeds": runs, "worst_over_best": max(r["over_best"] for r in runs),
            "median_over_best": statistics.median(r["over_best"] for r in runs),
            "within_2pct": sum(r["over_best"] <= 0.02 for r in runs),
            "ran_median": statistics.median(r["ran"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    space = load_spec(SPEC, import_kernel=False).expand()
    if not TABLE.exists():
        make_table(space)
    rows = {r["config"]: r for r in pq.read_table(TABLE).to_pylist()}
    truth = [rows[space.config_json(i)]["latency_ms"] for i in range(len(space))]
    result = record.header("small_space")
    result.update(spec=str(SPEC.relative_to(ROOT)), table=str(TABLE.relative_to(ROOT)),
                  configs=len(space), best_ms=min(t for t in truth if t is not None))
    for name in ("guided", "halving"):
        for when in ("before", "after"):
            s = result[f"{name}_{when}"] = seeds(space, truth, name, when == "after")
            print(f"{name:8} {when:6} ran median {s['ran_median']:g} of {len(space)}, "
                  f"within 2% in {s['within_2pct']}/10 seeds, pick over the best: median "
                  f"+{s['median_over_best']:.1%}, worst +{s['worst_over_best']:.1%}")
    print(record.write(result, args.out))


if __name__ == "__main__":
    main()
