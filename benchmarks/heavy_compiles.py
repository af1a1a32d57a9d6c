"""Heavy kernels at the compiler's speed (issue 36), one call on one GPU (nvidia-h200).

Every figure is a whole command's wall clock with empty caches unless it says warm, in one
call and in this order:
- `python -c "import torch, triton"`, the floor every command pays;
- `triton.autotune` over the 64 configs of configs/matmul.yaml (the baseline);
- `sweep run configs/matmul.yaml`, then again with Triton's cache warm (--force);
- `sweep run configs/matmul-shapes.yaml` (8 sizes, 544 configs);
- `sweep run` of Liger-Kernel 0.8.5's block RMSNorm, benchmarks/third_party/liger-rms-324.yaml
  (the package importable, e.g. its wheel installed into a folder on PYTHONPATH);
- the matmul's pick and `triton.autotune`'s pick, timed interleaved (A B A B ...,
  do_bench(25, 100) median per round, --rounds rounds) in a process of their own.
For each run: the timeline (snapshot.json, seconds since launch), counts, deaths
(attempts.jsonl), the report's busy share per worker (`sweep report`'s own figure), the
pick against the best one-pass latency of the table (per problem), and the run directory's
main files with an event trace (actors/trace.py) in one OUT/NAME.tar.gz, for a closer look
(one file a run: the device tool returns a few files, no deep folders).

Usage (on the GPU machine): python3 benchmarks/heavy_compiles.py --out DIR [--only NAMES]
    [--commit SHA] [--rounds 7]
Writes DIR/heavy_compiles-DATE.json after each part, so a call cut short keeps its numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_sweep import autotune_baseline  # noqa: E402
from benchmarks.third_party import commit  # noqa: E402

THIRD = ROOT / "benchmarks" / "third_party"
RUNS = ("matmul_empty", "matmul_warm", "shapes_empty", "liger_rms")

RETIME = r"""
import json, sys, torch, triton, triton.testing
from sweep_kernels.matmul import KERNEL
picks, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
problem = {"M": 8192, "N": 8192, "K": 8192, "dtype": "bfloat16"}
inputs = KERNEL.make_inputs(problem, "cuda", 0)
args, _ = KERNEL.launch_args(inputs, problem)
launches = {n: (lambda c=c: KERNEL.fn[KERNEL.grid(problem, c)](*args, **c))
            for n, c in picks.items()}
got = {n: [] for n in picks}
for _ in range(rounds):
    for n, launch in launches.items():
        got[n].append(triton.testing.do_bench(launch, warmup=25, rep=100,
                                              return_mode="median"))
print(json.dumps(got))
"""


def run(name: str, spec: Path, tmp: Path, cache: Path, out: Path,
        env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    """`python -m sweep run SPEC --out DIR --force`, as a user runs it, and what its run
    directory says."""
    run_dir = tmp / name
    trace = tmp / f"{name}.trace.jsonl"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1",
           "SWEEP_CACHE_DIR": str(tmp / f"best-{name}"), "SWEEP_TRACE": str(trace),
           **(env_extra or {})}
    launched = time.time()
    proc = subprocess.run([sys.executable, "-m", "sweep", "run", str(spec), "--out",
                           str(run_dir), "--force"], cwd=spec.parent, env=env,
                          capture_output=True, text=True, timeout=400)
    exited = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)  # a sweep that failed early made none
    (run_dir / "command.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    entry: dict[str, Any] = {"name": name, "rc": proc.returncode,
                             "command_s": exited - launched}
    if (run_dir / "snapshot.json").exists():
        entry.update(read_run(run_dir, launched))
        entry["phases_s"]["exit"] = exited - launched
    with tarfile.open(out / f"{name}.tar.gz", "w:gz") as tar:
        for kept in ("trials.parquet", "snapshot.json", "best.json", "workers.log",
                     "attempts.jsonl", "command.log"):
            if (run_dir / kept).exists():
                tar.add(run_dir / kept, arcname=kept)
        if trace.exists():
            tar.add(trace, arcname="trace.jsonl")
    entry["stderr_tail"] = proc.stderr[-3000:]
    return entry


def read_run(run_dir: Path, launched: float) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from sweep.report.analysis import analyse

    snap = json.loads((run_dir / "snapshot.json").read_text())["snapshot"]
    best = json.loads((run_dir / "best.json").read_text())
    rows = pq.read_table(run_dir / "trials.parquet").to_pylist()
    phases = {k: v - launched for k, v in snap["timeline"].items()}
    phases["table_written"] = snap["written_at"] - launched
    died = [line for line in (run_dir / "attempts.jsonl").read_text().splitlines()
            if '"died"' in line] if (run_dir / "attempts.jsonl").exists() else []
    workers = [{"worker": w.worker, "trials": w.trials, "busy_fraction": w.busy_fraction,
                "busy_s": w.busy_s, "waiting_s": w.waiting_s, "starting_s": w.starting_s}
               for w in analyse(run_dir).workers]
    compiles = sorted(r["compile_ms"] for r in rows if r.get("compile_ms"))
    return {"phases_s": dict(sorted(phases.items(), key=lambda kv: kv[1])),
            "counts": snap["counts"], "deaths": len(died), "workers": workers,
            "compile_ms": {"n": len(compiles), "sum": sum(compiles),
                           "p50": compiles[len(compiles) // 2] if compiles else None,
                           "max": compiles[-1] if compiles else None},
            "timeouts": [r["error"] for r in rows if r["status"] == "timeout"],
            "picks": picks(best, rows)}


def picks(best: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each problem's pick against its best one-pass latency in the table."""
    chosen = best.get("by_problem") or [best]
    out = []
    for doc in chosen:
        problem = doc.get("problem") or {}
        mine = [r for r in rows if r["status"] == "ok"
                and all(r[k] == v for k, v in problem.items() if k in r)]
        fastest = min(mine, key=lambda r: r["latency_ms"]) if mine else None
        row = next((r for r in mine if r["index"] == doc.get("index")), None)
        # The table's one-pass best side by side with the pick: its finalists' re-timing.
        retimed = {f["index"]: f["latency_ms"] for f in doc.get("finalists") or []}
        best_retimed = retimed.get(fastest["index"]) if fastest else None
        out.append({"problem": problem, "index": doc.get("index"), "config": doc.get("config"),
                    "latency_ms": doc.get("latency_ms"),
                    "one_pass_ms": row["latency_ms"] if row else None,
                    "table_best_index": fastest["index"] if fastest else None,
                    "table_best_ms": fastest["latency_ms"] if fastest else None,
                    "table_best_retimed_ms": best_retimed,
                    "pick_over_table_best_retimed": doc["latency_ms"] / best_retimed
                    if best_retimed and doc.get("latency_ms") else None})
    return out


def import_profile(module: str, cwd: Path) -> dict[str, Any]:
    """`python -X importtime -c "import MODULE"`: its wall clock and the slowest imports
    by cumulative time (microseconds), to see where a kernel's import goes."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                          cwd=cwd, capture_output=True, text=True)
    took = time.time() - t0
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), int(parts[0].split(":")[-1]), parts[2].rstrip()))
    rows.sort(reverse=True)
    return {"command_s": round(took, 2), "rc": proc.returncode,
            "top_cumulative_us": [[c, own, name] for c, own, name in rows[:40]],
            "top_self_us": [[own, name] for c, own, name in sorted(rows, key=lambda r: -r[1])[:25]]}


def matmul_configs() -> list[dict[str, Any]]:
    from sweep.spec import load_spec

    space = load_spec(ROOT / "configs" / "matmul.yaml").expand()
    return [space.kernel_config(i) for i in range(len(space))]


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    from importlib import metadata

    for name in ("torch", "triton", "pyarrow", "liger_kernel"):
        try:  # the distribution's version: liger_kernel has no __version__
            out[name] = metadata.version(name.replace("_", "-"))
        except Exception as e:
            out[name] = f"not installed: {type(e).__name__}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only",
                    default="import,liger_import,autotune," + ",".join(RUNS) + ",retime")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    only = set(args.only.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": datetime.date.today().isoformat(),
                              "commit": commit(args.commit), "versions": versions()}
    import torch

    result["hardware"] = {"gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count()}
    path = args.out / f"heavy_compiles-{result['date']}.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1, default=str))

    tmp = Path(tempfile.mkdtemp(prefix="heavy-"))
    if "import" in only:
        t0 = time.time()
        subprocess.run([sys.executable, "-c", "import torch, triton"], check=True)
        result["import_torch_triton_s"] = time.time() - t0
        print("import", round(result["import_torch_triton_s"], 2), flush=True)
    if "liger_import" in only:
        result["liger_import"] = import_profile("liger_rms", THIRD)
        print("liger_import", result["liger_import"]["command_s"], flush=True)
    configs = matmul_configs()
    if "autotune" in only:
        t0 = time.time()
        result["autotune"] = autotune_baseline(configs, tmp / "cache-autotune")
        result["autotune"]["command_s"] = time.time() - t0
        print("autotune", round(result["autotune"]["command_s"], 2), flush=True)
        save()
    specs = {"matmul_empty": (ROOT / "configs" / "matmul.yaml", "cache-matmul"),
             "matmul_warm": (ROOT / "configs" / "matmul.yaml", "cache-matmul"),
             "shapes_empty": (ROOT / "configs" / "matmul-shapes.yaml", "cache-shapes"),
             "liger_rms": (THIRD / "liger-rms-324.yaml", "cache-liger")}
    pythonpath = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    for name in RUNS:
        if name not in only:
            continue
        spec, cache = specs[name]
        result[name] = run(name, spec, tmp, tmp / cache, args.out,
                           {"PYTHONPATH": pythonpath})
        r = result[name]
        print(name, round(r["command_s"], 2), r.get("counts"), "deaths", r.get("deaths"),
              "busy", [round(w["busy_fraction"], 2) for w in r.get("workers", [])],
              {k: round(v, 1) for k, v in r.get("phases_s", {}).items()}, flush=True)
        save()
    if "retime" in only and "autotune" in result and result.get("matmul_empty", {}).get("picks"):
        pick = result["matmul_empty"]["picks"][0]["config"]
        both = {"sweep": pick, "triton_autotune": result["autotune"]["best"]}
        proc = subprocess.run([sys.executable, "-c", RETIME, json.dumps(both),
                               str(args.rounds)], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode == 0:
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            med = {n: sorted(v)[len(v) // 2] for n, v in got.items()}
            result["retime"] = {"configs": both, "samples_ms": got, "median_ms": med,
                                "sweep_over_autotune": med["sweep"] / med["triton_autotune"]}
        else:
            result["retime"] = {"error": proc.stderr[-2000:]}
        print("retime", result["retime"].get("median_ms"), flush=True)
    if "autotune" in result and "matmul_empty" in result:
        result["speedup_vs_autotune"] = (result["autotune"]["command_s"]
                                         / result["matmul_empty"]["command_s"])
    save()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
