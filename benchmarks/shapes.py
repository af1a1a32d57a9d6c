"""Tuning across shapes, on one GPU (the device tool's nvidia-h200): the eight M sizes of
configs/matmul-shapes.yaml (N = K = 4096, bfloat16) tuned three ways, each timed as a user
times it (the whole command, launch to exit) with an empty Triton cache (TRITON_CACHE_DIR)
and an empty best-config cache (SWEEP_CACHE_DIR) of its own:

(a) one `sweep run configs/matmul-shapes.yaml`: every size in one run (`problems:`);
(b) eight `sweep run`s, one a size (the same yaml with that size under `problem:` alone),
    one after another: the total and each one's time (each with its own empty caches,
    unless --b-cache shared);
(c) `triton.autotune(configs=<the space as triton.Config>, key=["M"])` over the same
    kernel function (sweep_kernels.matmul), each size given the same configs as the spec
    gives it (prune_configs_by), called at the eight sizes in one fresh Python process:
    the whole command, start-up included, the time in the process, and each size's pick;
(d) then, in one more fresh process, each size re-timed on one set of inputs: every config
    of the space timed once (do_bench, the screen's 5/20 ms), then side by side in
    interleaved rounds (A B C A B C ...; do_bench, 10/50 ms, 3 rounds): (a)'s, (b)'s and
    (c)'s picks, the top 10 of that screen, the top 10 of (b)'s trial table and the top 5
    of (a)'s. The fastest there is the size's exhaustive best; each pick's latency over
    it is the ratio the bar is about (each size's pick within 2% of its own best). Kernels
    under 20 us are also timed as the project times them (a CUDA graph's replay,
    actors/timing.py), and that ratio is recorded beside do_bench's.

Ratios: (a) against (b)'s total, against (c), and against one size's command (the median
of (b)'s eight; the target is (a) <= 2x that).

Budget: the device allows 10 minutes a call, so the whole script works to --budget-s
(540 s): each step's subprocesses get a time limit that leaves the later steps their
reserve, a command past its limit is stopped (SIGINT, then SIGKILL to its process group)
and recorded as such, and the JSON is written after every step, so a run cut short still
leaves its numbers. --skip a,b,c,d leaves steps out ((d) re-times whatever picks exist).

Usage (on the GPU machine, from the repository root):
    python3 benchmarks/shapes.py --out DIR [--skip c] [--budget-s 540]
Writes DIR/shapes-DATE.json and prints a table.
    python3 benchmarks/shapes.py --smoke --out DIR
runs every step at tiny sizes on Triton's CPU interpreter (float32, M in {16, 32},
N = K = 32, a 4-config space; the `sweep run`s with backend interpret, the autotune and
re-timing processes with TRITON_INTERPRET=1): a check of the plumbing, not a measurement.
Writes DIR/shapes_smoke-DATE.json.

This module is the driver: the command line, the steps in turn within the budget, the
result file and the table. The specs and the ratios are here too; running a command and
reading `sweep run`'s run directory ((a), (b)) are in shapes_command.py, (c)'s autotune
script in shapes_autotune.py, (d)'s re-timing process in shapes_retime.py.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.shapes_autotune import autotune_command  # noqa: E402
from benchmarks.shapes_command import (  # noqa: E402
    Config,
    key_of,
    picks_of_one_run,
    sweep_command,
    table_tops,
)
from benchmarks.shapes_retime import retime_child, retime_command  # noqa: E402

SPEC = ROOT / "configs" / "matmul-shapes.yaml"
BAR = 1.02  # each size's pick within 2% of its own exhaustive best
ONE_SIZE_TARGET = 2.0  # (a)'s command at most 2x one size's command
# Seconds each step needs at least to be worth starting: what a step before it leaves.
RESERVE_S = {"a": 60.0, "b": 80.0, "c": 90.0, "d": 60.0}


# --- the specs ---------------------------------------------------------------------------

def smoke_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The yaml at the interpreter's size: float32, M in {16, 32}, N = K = 32, 4 configs."""
    small = copy.deepcopy(doc)
    small["name"] = f"{doc['name']}-smoke"
    small["problem"] = {"N": 32, "K": 32, "dtype": "float32"}
    small["problems"] = [{"M": 16}, {"M": 32}]
    small["space"] = {"BLOCK_M": [16, 32], "BLOCK_N": [16, 32], "BLOCK_K": [16],
                      "GROUP_M": [1]}
    small.pop("constraints", None)
    small["timing"] = {"warmup_ms": 1, "rep_ms": 5, "screen": {"warmup_ms": 1, "rep_ms": 3}}
    small["run"] = {**doc.get("run", {}), "backend": "interpret", "finalist_rounds": 2}
    return small


def per_size_docs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """(b)'s specs: one a problem, that problem under `problem:` alone."""
    docs = []
    for entry in doc["problems"]:
        one = {k: copy.deepcopy(v) for k, v in doc.items() if k != "problems"}
        one["problem"] = {**doc.get("problem", {}), **entry}
        one["name"] = f"{doc['name']}-" + "-".join(f"{k}{v}" for k, v in entry.items())
        docs.append(one)
    return docs


def space_sets(spec_path: Path) -> tuple[list[dict[str, Any]], list[list[Config]], list[str]]:
    """Each problem (merged), the configs the spec gives it, and the parameter names."""
    from sweep.spec import load_spec

    spec = load_spec(spec_path, import_kernel=False)
    space = spec.expand()
    problems = [dict(p) for p in spec.each_problem()]
    sets = [[space.kernel_config(i) for i in space.problem_range(p)]
            for p in range(len(problems))]
    return problems, sets, list(space.kernel_names)


# --- the comparison ----------------------------------------------------------------------

def pick_ratios(retime: Mapping[str, Any],
                picks: Mapping[str, list[Config | None]]) -> list[dict[str, Any]]:
    """Per size: the exhaustive best (fastest re-timed) and each approach's pick over it,
    by do_bench and by the project's timer."""
    rows = []
    for p, size in enumerate(retime.get("sizes", [])):
        retimed = size["retimed"]
        if not retimed:
            continue
        by_key = {key_of(r["config"]): r for r in retimed}
        best = min(retimed, key=lambda r: r["median_ms"])
        best_project = min(retimed, key=lambda r: r["project_median_ms"])
        row: dict[str, Any] = {"problem": size["problem"], "configs": size["configs"],
                               "best": {"config": best["config"],
                                        "latency_ms": best["median_ms"]},
                               "best_project": {"config": best_project["config"],
                                                "latency_ms": best_project["project_median_ms"]}}
        for approach, chosen in picks.items():
            config = chosen[p] if p < len(chosen) else None
            got = by_key.get(key_of(config)) if config is not None else None
            if got is None:
                row[approach] = None
                continue
            ratio = got["median_ms"] / best["median_ms"]
            row[approach] = {"config": config, "latency_ms": got["median_ms"], "ratio": ratio,
                             "within_bar": ratio <= BAR,
                             "project_ratio": (got["project_median_ms"]
                                               / best_project["project_median_ms"])}
        rows.append(row)
    return rows


def command_ratios(result: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    a = result.get("a") or {}
    b = result.get("b") or {}
    c = result.get("c") or {}
    a_s = a.get("command_s") if a.get("rc") == 0 else None
    runs = [r for r in b.get("runs", []) if r.get("rc") == 0]
    complete_b = len(runs) == len(b.get("runs", [])) and runs
    if a_s and complete_b:
        out["a_vs_b_total"] = a_s / b["total_s"]
    if a_s and runs:
        one = statistics.median(r["command_s"] for r in runs)
        out["one_size_command_s"] = one
        out["a_vs_one_size"] = a_s / one
        out["a_within_2x_one_size"] = a_s / one <= ONE_SIZE_TARGET
    if a_s and c.get("rc") == 0:
        out["a_vs_c"] = a_s / c["command_s"]
        out["c_over_a_speedup"] = c["command_s"] / a_s
    return out


def short(config: Config | None) -> str:
    if config is None:
        return "-"
    order = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
    return "/".join(str(config[k]) for k in order if k in config)


def print_table(result: Mapping[str, Any]) -> None:
    a, b, c = result.get("a") or {}, result.get("b") or {}, result.get("c") or {}
    print("\nwhole commands (launch to exit):")
    if a:
        print(f"  (a) one sweep over every size: {a['command_s']:.1f} s (rc {a['rc']}"
              f"{', timed out' if a['timed_out'] else ''})")
    if b:
        each = ", ".join(f"{r['command_s']:.1f}" + ("!" if r["rc"] != 0 else "")
                         for r in b.get("runs", []))
        print(f"  (b) one sweep a size: {b.get('total_s', 0):.1f} s in all ({each})")
    if c:
        print(f"  (c) triton.autotune: {c['command_s']:.1f} s (in the process "
              f"{c.get('in_process_s', float('nan')):.1f} s; rc {c['rc']}"
              f"{', timed out' if c['timed_out'] else ''})")
    for k, v in (result.get("ratios") or {}).items():
        print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")
    rows = result.get("picks") or []
    if not rows:
        return
    unit = "ms" if result.get("smoke") else "us"
    scale = 1.0 if result.get("smoke") else 1e3
    print(f"\neach size's pick over its exhaustive best (re-timed side by side; bar {BAR}):")
    print(f"  {'M':>5} {'cfgs':>4} {'best ' + unit:>9}  {'best config':<18}"
          f" {'(a) one run':>12} {'(b) per size':>12} {'(c) autotune':>12}")
    for row in rows:
        cells = []
        for approach in ("a", "b", "c"):
            got = row.get(approach)
            cells.append("-" if got is None else
                         f"{got['ratio']:.3f}{'' if got['within_bar'] else '*'}")
        print(f"  {row['problem'].get('M', '?'):>5} {row['configs']:>4} "
              f"{row['best']['latency_ms'] * scale:>9.2f}  {short(row['best']['config']):<18}"
              f" {cells[0]:>12} {cells[1]:>12} {cells[2]:>12}")
    print("  (* over the bar; configs as BLOCK_M/BLOCK_N/BLOCK_K/GROUP_M/warps/stages)")
    graphed = [row for row in rows
               if any(row.get(x) and abs(row[x]["project_ratio"] - row[x]["ratio"]) > 1e-9
                      for x in "abc")]
    if graphed:
        print("  by the project's timer (a CUDA graph's replay where do_bench gives < 20 us):")
        for row in graphed:
            cells = ["-" if row.get(x) is None else f"{row[x]['project_ratio']:.3f}"
                     for x in "abc"]
            print(f"  {row['problem'].get('M', '?'):>5} {row['configs']:>4} "
                  f"{row['best_project']['latency_ms'] * scale:>9.2f}  "
                  f"{short(row['best_project']['config']):<18}"
                  f" {cells[0]:>12} {cells[1]:>12} {cells[2]:>12}")


# --- the run -----------------------------------------------------------------------------

def hardware() -> dict[str, Any]:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
        gpus = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    return {"gpus": gpus or ["none (nvidia-smi absent or found no GPU)"],
            "cpu_cores": os.cpu_count()}



def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes on the CPU interpreter: checks the plumbing")
    ap.add_argument("--skip", default="", help="steps to leave out: any of a,b,c,d")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="the whole script's time; each step's limit leaves the later "
                         "steps their reserve")
    ap.add_argument("--b-cache", choices=("fresh", "shared"), default="fresh",
                    help="(b)'s Triton cache: empty for each size (fresh), or one for the "
                         "eight, as one after another on one machine share ~/.triton")
    ap.add_argument("--top", type=int, default=10, help="(d): the screen's top re-timed")
    ap.add_argument("--rounds", type=int, default=3, help="(d): interleaved rounds")
    ap.add_argument("--warmup-ms", type=float, default=10.0, help="(d): side by side")
    ap.add_argument("--rep-ms", type=float, default=50.0, help="(d): side by side")
    ap.add_argument("--retime-child", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.retime_child:
        retime_child(args.retime_child)
        return
    from benchmarks import record

    started = time.time()
    deadline = started + args.budget_s
    skip = {s for s in args.skip.replace(",", "") if s in "abcd"}
    steps = [s for s in "abcd" if s not in skip]

    def limit(step: str) -> float:
        """What `step` may take: the budget left less the later steps' reserves."""
        later = sum(RESERVE_S[s] for s in steps if s > step)
        return max(10.0, deadline - time.time() - later)

    result = record.header("shapes_smoke" if args.smoke else "shapes")
    result.update({"smoke": args.smoke, "hardware": hardware(), "skip": sorted(skip),
                   "budget_s": args.budget_s, "b_cache": args.b_cache, "bar": BAR,
                   "one_size_target": ONE_SIZE_TARGET})

    def save() -> Path:  # after each step, so a run cut short still leaves its numbers
        result["script_s"] = time.time() - started
        return record.write(result, args.out)

    doc = yaml.safe_load(SPEC.read_text())
    if args.smoke:
        doc = smoke_doc(doc)
    with tempfile.TemporaryDirectory(prefix="shapes-") as tmp_name:
        run_steps(Step(args, steps, limit, save, result, Path(tmp_name)), doc)
    path = save()
    print_table(result)
    print(f"\nwritten {path} ({time.time() - started:.0f} s)")


@dataclass
class Step:
    """What each step is given: the command line, the steps to run, each one's time limit,
    how to save the result, the result it adds to, and the run's scratch directory."""

    args: argparse.Namespace
    steps: list[str]
    limit: Callable[[str], float]
    save: Callable[[], Path]
    result: dict[str, Any]
    tmp: Path


def run_steps(run: Step, doc: dict[str, Any]) -> None:
    """(a) to (d) in turn, the result saved after each."""
    args, steps, limit, result, tmp = run.args, run.steps, run.limit, run.result, run.tmp
    spec_path = tmp / "shapes.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result["spec"] = doc
    problems, sets, names = space_sets(spec_path)
    result["configs_per_size"] = [len(s) for s in sets]
    print(f"{len(problems)} sizes, {sum(len(s) for s in sets)} configs "
          f"({', '.join(str(len(s)) for s in sets)}); budget {args.budget_s:.0f} s",
          flush=True)
    run.save()

    if "a" in steps:
        a = sweep_command(spec_path, tmp / "a", tmp / "triton-a", tmp / "sweep-a",
                          limit("a"))
        result["a"] = a
        print(f"(a) one sweep: {a['command_s']:.1f} s, rc {a['rc']}", flush=True)
        run.save()

    if "b" in steps:
        per_size_runs(run, doc, len(problems))

    if "c" in steps:
        c = autotune_command(problems, sets, names, tmp, tmp / "triton-c", args.smoke,
                             limit("c"))
        result["c"] = c
        print(f"(c) triton.autotune: {c['command_s']:.1f} s, rc {c['rc']}, "
              f"picks for {len(c['sizes'])} sizes", flush=True)
        run.save()

    result["ratios"] = command_ratios(result)
    run.save()

    picks: dict[str, list[Config | None]] = {
        "a": picks_of_one_run(result.get("a") or {}, len(problems)),
        "b": [(r.get("best") or {}).get("config")
              for r in (result.get("b") or {}).get("runs", [])],
        "c": [s["best"] for s in (result.get("c") or {}).get("sizes", [])]}
    result["pick_configs"] = picks
    if "d" in steps:
        # A warm Triton cache: (c)'s compiled every config at every size, else (a)'s.
        warm = next((tmp / d for d in ("triton-c", "triton-a")
                     if (tmp / d).exists()), tmp / "triton-d")
        d = retime_command(problems, sets, retime_extras(result, picks, sets), tmp, warm,
                           args.smoke, args, limit("d"))
        result["d"] = d
        result["picks"] = pick_ratios(d, picks)
        print(f"(d) re-timing: {d['command_s']:.1f} s, rc {d['rc']}, "
              f"{len(d.get('sizes', []))} sizes", flush=True)


def per_size_runs(run: Step, doc: dict[str, Any], sizes: int) -> None:
    """(b): a `sweep run` a size, one after another, within (b)'s limit."""
    b_cache, tmp = run.args.b_cache, run.tmp
    b: dict[str, Any] = {"runs": [], "cache": b_cache}
    run.result["b"] = b
    b_deadline = time.time() + run.limit("b")
    for i, one in enumerate(per_size_docs(doc)):
        left = b_deadline - time.time()
        if left < 10:
            b["runs"].append({"name": one["name"], "skipped": "budget", "rc": None,
                              "command_s": 0.0})
            continue
        path = tmp / f"{one['name']}.yaml"
        path.write_text(yaml.safe_dump(one, sort_keys=False))
        cache = tmp / ("triton-b" if b_cache == "shared" else f"triton-b{i}")
        got = sweep_command(path, tmp / f"b{i}", cache, tmp / f"sweep-b{i}",
                            min(left, left / (sizes - i) * 2))
        got["name"] = one["name"]
        got["problem"] = one["problem"]
        b["runs"].append(got)
        b["total_s"] = sum(r["command_s"] for r in b["runs"])
        print(f"(b) {one['name']}: {got['command_s']:.1f} s, rc {got['rc']}", flush=True)
        run.save()


def retime_extras(result: Mapping[str, Any], picks: Mapping[str, list[Config | None]],
                  sets: list[list[Config]]) -> list[list[tuple[str, Config]]]:
    """(d)'s candidates beyond its own screen's top, for each size: each approach's pick,
    the top 10 of (b)'s trial table for that size and the top 5 of (a)'s."""
    extras: list[list[tuple[str, Config]]] = []
    a_rows = (result.get("a") or {}).get("rows") or []
    b_runs = (result.get("b") or {}).get("runs", [])
    start = 0
    for p, configs in enumerate(sets):
        extra: list[tuple[str, Config]] = []
        for approach, chosen in picks.items():
            config = chosen[p] if p < len(chosen) else None
            if config is not None:
                extra.append((f"{approach}_pick", config))
        if p < len(b_runs) and b_runs[p].get("rows"):
            extra += [("b_table_top", cfg)
                      for cfg in table_tops(b_runs[p]["rows"], 0, len(configs), 10)]
        extra += [("a_table_top", cfg)
                  for cfg in table_tops(a_rows, start, len(configs), 5)]
        extras.append(extra)
        start += len(configs)
    return extras


if __name__ == "__main__":
    main()
