"""What benchmarks/autotune_capture.py reads back: the programs' JSON lines, Triton's own
picks (the lines TRITON_PRINT_AUTOTUNING=1 prints), and per tuned key of a run directory
(best.json's by_problem over trials.parquet) the pick's margin over the exhaustive best and
where Triton's own pick stands among the same trials.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
from pathlib import Path
from typing import Any

from sweep.autotune.hook import config_form

# Triton 3.4 to 3.9, Autotuner.run with knobs.autotuning.print: one block per tuned key.
_PICK = re.compile(r"Triton autotuning for function (?P<fn>\w+),\s*with key as (?P<key>.*?),"
                   r"\s*finished after (?P<s>[\d.]+)s,\s*best config selected: (?P<cfg>.*?);",
                   re.S)
TARGET_MARGIN = 0.02  # a pick within 2% of the exhaustive best


def program_lines(lines: list[str]) -> list[dict[str, Any]]:
    """The program's result lines (one JSON object per size, each naming its program)."""
    out = []
    for line in lines:
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "program" in doc:
                out.append(doc)
    return out


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


def triton_picks(stdout: list[str]) -> list[dict[str, Any]]:
    """Each key Triton's autotune tuned in the program: function, key, seconds, config."""
    picks = []
    for m in _PICK.finditer("\n".join(stdout)):
        config = {}
        for part in m["cfg"].split(", "):
            name, _, value = part.partition(": ")
            config[name.strip()] = _literal(value)
        config = {k: v for k, v in config.items() if k != "ir_override"}
        key = _literal(m["key"])
        picks.append({"function": m["fn"], "key": list(key) if isinstance(key, tuple) else key,
                      "tune_s": float(m["s"]), "config": config})
    return picks


def _label_values(label: str) -> list[str]:
    """The key's values of a capture label ("H_dim=4096, I_dim=3584; bfloat16 #2")."""
    names = label.split(";")[0]
    return [part.partition("=")[2].strip() for part in names.split(", ") if "=" in part]


def _triton_pick_for(problem: dict[str, Any], picks: list[dict[str, Any]]) -> dict | None:
    function = str(problem.get("kernel", "")).rpartition(":")[2]
    values = _label_values(str(problem.get("key", "")))
    for pick in picks:
        key = pick["key"] if isinstance(pick["key"], list) else []
        if pick["function"] == function and [str(v) for v in key[:len(values)]] == values:
            return pick
    return None


def _rows(run_dir: Path) -> dict[int, dict[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(run_dir / "trials.parquet",
                          columns=["index", "config", "status", "validation", "latency_ms"])
    return {r["index"]: r for r in table.to_pylist()}


def per_key(run_dir: Path, picks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per problem of the run: its exhaustive best (every config timed: the fastest ok
    trial), the pick (best.json's, re-timed among finalists) and its margin over that best
    in the same first-pass timings, and Triton's own pick's place among them."""
    best_doc = json.loads((run_dir / "best.json").read_text())
    rows = _rows(run_dir)
    out = []
    for p in best_doc.get("by_problem") or []:
        mine = [rows[i] for i in range(p["first_index"], p["first_index"] + p["configs"])
                if i in rows]
        ok = [r for r in mine if r["status"] == "ok" and r["latency_ms"] is not None]
        entry: dict[str, Any] = {"problem": p["problem"], "configs": p["configs"],
                                 "trials": len(mine), "ok": len(ok),
                                 "statuses": dict(_count(r["status"] for r in mine))}
        if not ok:
            out.append(entry)
            continue
        fastest = min(ok, key=lambda r: r["latency_ms"])
        entry["best"] = {"index": fastest["index"], "config": json.loads(fastest["config"]),
                         "latency_ms": fastest["latency_ms"]}
        pick_row = rows.get(p["index"]) if p.get("index") is not None else None
        if pick_row is not None and pick_row["latency_ms"] is not None:
            margin = pick_row["latency_ms"] / fastest["latency_ms"] - 1
            entry["pick"] = {"index": p["index"], "config": p["config"],
                             "latency_ms": pick_row["latency_ms"],
                             "finalist_latency_ms": p["latency_ms"], "margin": margin,
                             "within_target": margin <= TARGET_MARGIN}
        theirs = _triton_pick_for(p["problem"], picks)
        if theirs is not None:
            entry["triton_pick"] = _placed(theirs, mine, fastest["latency_ms"])
        out.append(entry)
    return out


def _placed(pick: dict[str, Any], mine: list[dict[str, Any]], best_ms: float) -> dict:
    form = config_form(pick["config"])
    row = next((r for r in mine if config_form(json.loads(r["config"])) == form), None)
    placed: dict[str, Any] = {"config": pick["config"], "tune_s": pick["tune_s"]}
    if row is None:
        placed["found"] = False
    elif row["latency_ms"] is None:
        placed.update(found=True, status=row["status"])
    else:
        placed.update(found=True, index=row["index"], latency_ms=row["latency_ms"],
                      margin=row["latency_ms"] / best_ms - 1)
    return placed


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


def steady_pairs(triton_runs: list[list[dict[str, Any]]],
                 ours_runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per size of the program (its n-th JSON line): the steady step under Triton's picks
    and under the run's, run by run, and the median of ours / theirs (1.02 = 2% slower)."""
    sizes = min((len(r) for r in triton_runs + ours_runs), default=0)
    out = []
    for i in range(sizes):
        theirs = [r[i]["steady_step_s"] for r in triton_runs]
        ours = [r[i]["steady_step_s"] for r in ours_runs]
        ratios = [o / t for o, t in zip(ours, theirs)]
        size = {k: v for k, v in triton_runs[0][i].items()
                if isinstance(v, int) and not isinstance(v, bool)}
        out.append({"size": size, "triton_steady_s": theirs, "ours_steady_s": ours,
                    "ratios": ratios, "median_ratio": statistics.median(ratios),
                    "within_target": statistics.median(ratios) <= 1 + TARGET_MARGIN,
                    "checksums": {"triton": triton_runs[0][i].get("checksum"),
                                  "ours": ours_runs[0][i].get("checksum")}})
    return out
