"""Reading a run directory for benchmarks/third_party.py: what `sweep run` left there
(snapshot.json, best.json, trials.parquet, attempts.jsonl) and the command's stderr, as
the result's figures: throughput, counts, worker deaths, timeouts and what the compile
limit stopped; and, after `sweep resume --retry timeout`, how those configs fared.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actors.protocol import CompileLimit

Row = dict[str, Any]  # one row of trials.parquet, with its config parsed as "params"


def quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)

    def at(q: float) -> float:
        return v[min(len(v) - 1, round(q * (len(v) - 1)))]

    return {"n": len(v), "min": v[0], "p10": at(0.1), "p50": at(0.5), "p90": at(0.9),
            "p99": at(0.99), "max": v[-1], "mean": statistics.fmean(v)}


def compile_limited(row: Row) -> bool:
    return CompileLimit.stopped(row["status"], row["error"])


def neighbours(config: dict[str, Any], ok: list[Row]) -> list[Row]:
    """The ok rows whose config differs from config in exactly one parameter."""
    return [r for r in ok
            if sum(r["params"].get(k) != v for k, v in config.items()) == 1]


def read_run(run_dir: Path, command: dict[str, Any]) -> dict[str, Any]:
    """What DIR says of the run, with the command's wall clock and stderr."""
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    out.update(_snapshot(run_dir, command["launched_at"]))
    if (run_dir / "best.json").exists():
        best = json.loads((run_dir / "best.json").read_text())
        out["best"] = {k: best.get(k) for k in ("index", "config", "latency_ms", "device",
                                                "partial", "finalists", "baseline")}
    rows = _rows(run_dir)
    ran = [r for r in rows if r["status"] != "pruned"]
    counts: dict[str, int] = {}
    for r in ran:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    out["counts"] = counts
    out.update(_throughput(ran, command["command_s"]))
    out["retried_rows"] = [{"index": r["index"], "attempt": r["attempt"],
                            "status": r["status"]} for r in ran if r["attempt"] > 1]
    out["deaths"] = _deaths(run_dir, command["stderr"])
    out["timeouts"] = _timeouts(ran, counts)
    out["statuses_by_parameter"] = by_parameter(ran)
    out["errors_sample"] = sorted({(r["error"] or "")[:160] for r in ran if r["error"]})[:8]
    out["rows"] = [{k: r[k] for k in ("index", "status", "latency_ms", "compile_ms",
                                       "attempt", "worker")} | {"config": r["params"]}
                   for r in rows]
    return out


def _snapshot(run_dir: Path, launched: float) -> dict[str, Any]:
    """snapshot.json's state and counts, its timeline in seconds since the launch."""
    snap_path = run_dir / "snapshot.json"
    if not snap_path.exists():
        return {}
    snap = json.loads(snap_path.read_text())["snapshot"]
    return {"state": snap["state"], "total": snap["total"], "done": snap["done"],
            "snapshot_counts": snap["counts"],
            "timeline_s": {k: round(v - launched, 3) for k, v in
                           sorted(snap["timeline"].items(), key=lambda kv: kv[1])},
            "table_written_s": snap["written_at"] - launched}


def _rows(run_dir: Path) -> list[Row]:
    """trials.parquet's rows (none where there is no table), each config parsed."""
    import pyarrow.parquet as pq

    rows: list[Row] = []
    if (run_dir / "trials.parquet").exists():
        rows = pq.read_table(run_dir / "trials.parquet").to_pylist()
    for r in rows:
        r["params"] = json.loads(r["config"])
    return rows


def _throughput(ran: list[Row], command_s: float) -> dict[str, Any]:
    """Trials and trials/s, over the whole command and over the trials' own span."""
    out: dict[str, Any] = {"trials": len(ran),
                           "trials_per_s": len(ran) / command_s if command_s else None}
    if ran:
        span = (max(r["finished_at"] for r in ran) - min(r["started_at"] for r in ran))
        span_s = span.total_seconds()
        out["trials_span_s"] = span_s
        out["trials_per_s_in_span"] = len(ran) / span_s if span_s > 0 else None
    return out


def _deaths(run_dir: Path, stderr: list[str]) -> dict[str, Any]:
    """Worker deaths, as the run recorded them and as the user saw them."""
    died = []
    if (run_dir / "attempts.jsonl").exists():
        for line in (run_dir / "attempts.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "died":
                    died.append({k: entry.get(k) for k in ("index", "attempt", "why")})
    out: dict[str, Any] = {
        "attempts_died": died,
        "stderr_died_running_trial": [x for x in stderr if "died running trial" in x],
        "stderr_died_while_starting": [x for x in stderr if "died while starting" in x],
        "stderr_no_progress": [x for x in stderr if "made no progress" in x],
    }
    out["count"] = max(len(died), len(out["stderr_died_running_trial"]))
    return out


def _timeouts(ran: list[Row], counts: dict[str, int]) -> dict[str, Any]:
    """Timeouts, and what the compile limit stopped against the compiles it let through."""
    ok = [r for r in ran if r["status"] == "ok"]
    best_ok = min((r["latency_ms"] for r in ok), default=None)
    limited = [r for r in ran if compile_limited(r)]
    others = [r for r in ran if r["compile_ms"] is not None and not compile_limited(r)]
    stopped = [_stopped(r, ok, best_ok) for r in limited]
    return {
        "total": counts.get("timeout", 0),
        "compile_limited": stopped,
        "other": [{"index": r["index"], "config": r["params"], "error": (r["error"] or "")[:300]}
                  for r in ran if r["status"] == "timeout" and not compile_limited(r)],
        "limits": _limits(limited),
        # Were they slow ones? How the fastest ok config one parameter away from each ran,
        # against the best of the run (1.0: as fast as the best).
        "fastest_neighbour_vs_best": quantiles([x["fastest_neighbour"]["vs_best"]
                                                for x in stopped if x["fastest_neighbour"]]),
        "compile_ms_of_the_rest": quantiles([r["compile_ms"] for r in others]),
        # Compiles under 50 ms found their binary in Triton's cache (docs/cluster.md,
        # "On a GPU": Compile limit).
        "compile_ms_of_the_rest_over_50ms": quantiles([r["compile_ms"] for r in others
                                                       if r["compile_ms"] >= 50]),
        "ok_latency_ms": quantiles([r["latency_ms"] for r in ok]),
        "ok_best_latency_ms": best_ok,
    }


def _limits(limited: list[Row]) -> list[dict[str, float | None]]:
    """Each compile limit the rows were stopped at, once: the adaptive limit moves as
    compiles end."""
    limits: list[dict[str, float | None]] = []
    for r in limited:
        m = re.search(r"limit of ([\d.]+) s", r["error"] or "")
        # (p90: the rule's statistic before 2026-12-03)
        typical = re.search(r"(?:p90|median) compile of ([\d.e+-]+) s", r["error"] or "")
        seen = {"limit_s": float(m.group(1)) if m else None,
                "typical_s": float(typical.group(1)) if typical else None}
        if seen not in limits:
            limits.append(seen)
    return limits


def _stopped(r: Row, ok: list[Row], best_ok: float | None) -> dict[str, Any]:
    """One row the compile limit stopped, with the fastest ok config one step away."""
    near = neighbours(r["params"], ok)
    fastest = min(near, key=lambda n: n["latency_ms"]) if near else None
    return {
        "index": r["index"], "config": r["params"], "compile_ms": r["compile_ms"],
        "error": (r["error"] or "")[:300], "neighbours_ok": len(near),
        "fastest_neighbour": None if fastest is None else {
            "index": fastest["index"], "config": fastest["params"],
            "latency_ms": fastest["latency_ms"],
            "vs_best": fastest["latency_ms"] / best_ok if best_ok else None}}


def by_parameter(rows: list[Row]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per parameter value: the statuses, and the best ok latency."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        for k, v in r["params"].items():
            cell = out.setdefault(k, {}).setdefault(str(v), {"best_ms": None})
            cell[r["status"]] = cell.get(r["status"], 0) + 1
            if r["status"] == "ok" and (cell["best_ms"] is None
                                        or r["latency_ms"] < cell["best_ms"]):
                cell["best_ms"] = r["latency_ms"]
    return out


def retried(run_dir: Path, indices: list[int], first_best_ms: float | None) -> dict[str, Any]:
    """After `sweep resume --retry timeout`: how the configs the compile limit stopped
    fared when compiled after all, against the first pass's best."""
    import pyarrow.parquet as pq

    rows = {r["index"]: r for r in pq.read_table(run_dir / "trials.parquet").to_pylist()}
    ok_ms = sorted(r["latency_ms"] for r in rows.values() if r["status"] == "ok")
    out = []
    for i in indices:
        r = rows[i]
        ms = r["latency_ms"]
        out.append({"index": i, "config": json.loads(r["config"]), "status": r["status"],
                    "attempt": r["attempt"], "compile_ms": r["compile_ms"], "latency_ms": ms,
                    "vs_first_best": ms / first_best_ms if ms and first_best_ms else None,
                    "rank_among_ok": ok_ms.index(ms) + 1 if ms in ok_ms else None,
                    "error": (r["error"] or "")[:300]})
    done = [o for o in out if o["status"] == "ok"]
    return {"configs": out, "ok": len(done), "of": len(out),
            "fastest_vs_first_best": min((o["vs_first_best"] for o in done), default=None),
            "ok_total_after": len(ok_ms)}
