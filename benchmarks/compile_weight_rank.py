"""How well compile_weight (actors/protocol.py) orders compiles: Spearman's rank correlation
between each config's weight and its recorded compile time, over tables recorded on an
H200 (cache hits, under 50 ms, left out), for the weight as it is and the two it replaced
or might have been. Offline, on committed tables; any machine.

Usage: python benchmarks/compile_weight_rank.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actors.compile_limit import CACHE_HIT_MS  # noqa: E402
from actors.protocol import compile_weight  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TABLES = {
    "liger_rms_324 (compile limit 60 s)": "heavy_compiles_diag_liger_rms-2026-12-03.parquet",
    "matmul_64": "heavy_compiles_adopt_matmul_empty-2026-12-03.parquet",
    "matmul_shapes_544": "heavy_compiles_adopt_shapes_empty-2026-12-03.parquet",
}


def product(config: Mapping[str, Any], leave_out: Sequence[str] = ()) -> float:
    weight = 1.0
    for key, value in config.items():
        if key not in leave_out and isinstance(value, int) and not isinstance(value, bool) \
                and value > 1:
            weight *= value
    return weight


WEIGHTS: dict[str, Callable[[dict[str, Any]], float]] = {
    "compile_weight (per warp)": compile_weight,
    "product, warps a factor (before)": product,
    "product without warps": lambda c: product(c, ("num_warps",)),
}


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {}
    for name, file in TABLES.items():
        rows = [r for r in pq.read_table(RESULTS / file).to_pylist()
                if r["compile_ms"] is not None and r["compile_ms"] >= CACHE_HIT_MS]
        configs = [json.loads(r["config"]) for r in rows]
        times = [r["compile_ms"] for r in rows]
        result[name] = {"table": file, "compiles": len(rows), **{
            label: round(spearman([weight(c) for c in configs], times), 3)
            for label, weight in WEIGHTS.items()}}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
