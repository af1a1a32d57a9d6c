"""Time to answer, on a machine with 2 GPUs (the device tool's nvidia-h200-x2): what a user
times is the whole command, so every figure here is from launch to exit, with the run's own
timeline (snapshot.json) to show where the seconds went.

(a) The 64-config matmul of configs/matmul.yaml: `triton.autotune` on one GPU (the
    baseline, empty Triton cache), then `sweep run` on --gpus GPUs starting its own Ray, with an
    empty cache and twice warm; then against a Ray instance that is already running
    (`ray start --head`; `--address`), empty cache and warm.
(b) The 600-config space of gpu_sweep.py (b), on 1 to --gpus GPUs, empty caches; the trial
    tables are kept as replay inputs (benchmarks/tables/).
(c) Every ok config of (a) re-timed interleaved, to see how far each pick is from the best.
(t) The embedded runtime's targets, one GPU: `python -c "import torch, triton"`, then
    `triton.autotune` over the 64 configs (the baseline, empty Triton cache), then `sweep run`
    on the local runtime (the default) with an empty Triton cache, warm, and answered by
    the best-config cache; `--runtime ray` starting its own Ray (the old default), and
    against a running `ray start` head (`--address`), each with an empty Triton cache.

Usage (on the GPU machine):
    python3 benchmarks/time_to_answer.py --gpus N --out DIR [--tables DIR] [--only abct]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_sweep import SPEC_600, autotune_baseline  # noqa: E402


def command(spec: dict, tmp: Path, name: str, cache: Path, *extra: str,
            env_extra: dict[str, str] | None = None, force: bool = True) -> dict:
    """`python -m sweep run` as a user runs it; its wall clock, phases and picks (a run
    the best-config cache answered has only its wall clock and summary)."""
    spec_path = tmp / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp / name
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "RAY_USAGE_STATS_ENABLED": "0",
           **(env_extra or {})}
    launched = time.time()
    proc = subprocess.run([sys.executable, "-m", "sweep", "run", spec_path, "--out", out,
                           *(["--force"] if force else []), *extra], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=400)
    exited = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    if not (out / "snapshot.json").exists():  # answered by the best-config cache
        return {"name": name, "command_s": exited - launched, "summary": proc.stdout,
                "stderr": proc.stderr}
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    best = json.loads((out / "best.json").read_text())
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "trials.parquet").to_pylist()
    phases = {k: v - launched for k, v in snap["timeline"].items()}
    phases["table_written"] = snap["written_at"] - launched
    phases["exit"] = exited - launched
    return {"name": name, "command_s": exited - launched,
            "phases_s": dict(sorted(phases.items(), key=lambda kv: kv[1])),
            "counts": snap["counts"], "trials": len(rows),
            "best": {k: best[k] for k in ("index", "config", "latency_ms", "device")},
            "finalists": best["finalists"], "idle": idle(rows), "summary": proc.stdout,
            "out": str(out)}


def idle(rows: list[dict]) -> dict:
    """Per worker: the span from its first trial's start to its last's end, and the part
    of it its device ran no trial (waiting on compiles, or on the driver)."""
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["status"] in ("compile_error",) and not r["compile_ms"]:
            continue
        by_worker.setdefault(r["worker"], []).append(
            (r["started_at"].timestamp(), r["finished_at"].timestamp()))
    out = {}
    for worker, spans in by_worker.items():
        spans.sort()
        busy = sum(b - a for a, b in spans)
        total = spans[-1][1] - spans[0][0]
        out[worker] = {"span_s": total, "busy_s": busy, "idle_s": total - busy}
    return out


@contextlib.contextmanager
def ray_head(record: dict) -> Iterator[str]:
    """A Ray instance already up (`ray start --head`, token authentication off) for the
    block; its address. record gets the start's exit code."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    started = subprocess.run([*ray_cli, "start", "--head", "--include-dashboard=false",
                              "--port=6399"], env=env, capture_output=True, text=True)
    record["ray_start_rc"] = started.returncode
    try:
        yield "127.0.0.1:6399"
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], env=env, capture_output=True)
        del os.environ["RAY_AUTH_MODE"]


def address_runs(a: dict, spec: dict, tmp: Path, save: Callable[[], None]) -> None:
    """Against a Ray instance that is already up (`ray start --head`)."""
    with ray_head(a) as address:
        for name in ("address_empty", "address_warm"):
            a[name] = command(spec, tmp, name, tmp / "cache-address", "--address", address)
            print(name, round(a[name]["command_s"], 2),
                  {k: round(v, 2) for k, v in a[name]["phases_s"].items()}, flush=True)
            save()


def targets(t: dict, base: dict, configs: list[dict], tmp: Path,
            save: Callable[[], None]) -> None:
    """(t): every figure a whole command's wall clock, in one call."""
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch, triton"], check=True)
    t["import_torch_triton_s"] = time.time() - t0
    t0 = time.time()
    t["autotune"] = autotune_baseline(configs, tmp / "cache-t-autotune")
    t["autotune"]["command_s"] = time.time() - t0
    print("autotune", round(t["autotune"]["command_s"], 2), flush=True)
    save()
    best_cache = {"SWEEP_CACHE_DIR": str(tmp / "best-cache")}
    runs = [("local_empty", tmp / "cache-t-local", (), True),
            ("local_warm", tmp / "cache-t-local", (), True),
            ("local_cached", tmp / "cache-t-local", (), False),
            ("ray_own_empty", tmp / "cache-t-ray", ("--runtime", "ray"), True)]
    for name, cache, extra, force in runs:
        t[name] = command(base, tmp, name, cache, *extra, env_extra=best_cache, force=force)
        print(name, round(t[name]["command_s"], 2),
              {k: round(v, 2) for k, v in t[name].get("phases_s", {}).items()}, flush=True)
        save()
    with ray_head(t) as address:
        t["ray_head_empty"] = command(base, tmp, "ray_head_empty", tmp / "cache-t-head",
                                      "--address", address, env_extra=best_cache)
        print("ray_head_empty", round(t["ray_head_empty"]["command_s"], 2),
              {k: round(v, 2) for k, v in t["ray_head_empty"]["phases_s"].items()},
              flush=True)
        save()
    t["speedup_vs_autotune"] = t["autotune"]["command_s"] / t["local_empty"]["command_s"]


def with_workers(spec: dict, gpus: int) -> dict:
    return {**spec, "run": {**spec["run"], "workers": gpus}}


def autotune_runs(a: dict, base: dict, configs: list[dict], gpus: int, skip: set[str],
                  tmp: Path, save: Callable[[], None]) -> None:
    """(a): triton.autotune on one GPU, then `sweep run` on the GPUs, its own Ray each time
    (empty cache, then twice warm), then against a running Ray unless skipped."""
    t0 = time.time()
    a["autotune_1gpu"] = autotune_baseline(configs, tmp / "cache-autotune")
    a["autotune_1gpu"]["command_s"] = time.time() - t0
    print("autotune", json.dumps(a["autotune_1gpu"]), flush=True)
    save()
    spec = with_workers(base, gpus)
    for name in ("own_ray_empty", "own_ray_warm", "own_ray_warm2"):
        a[name] = command(spec, tmp, name, tmp / "cache-a")
        print(name, round(a[name]["command_s"], 2), a[name]["best"]["index"],
              {k: round(v, 2) for k, v in a[name]["phases_s"].items()}, flush=True)
        save()
    if "address" not in skip:
        address_runs(a, spec, tmp, save)


def scaling_runs(b: dict, gpus: int, skip: set[str], tables: Path, tmp: Path,
                 save: Callable[[], None]) -> None:
    """(b): the 600 configs on 1..gpus GPUs, empty caches, each trial table kept under
    tables as a replay input."""
    tables.mkdir(parents=True, exist_ok=True)
    for n in range(1, gpus + 1):
        name = f"matmul600_{n}gpu"
        b[name] = command(with_workers(SPEC_600, n), tmp, name, tmp / f"cache-{name}")
        shutil.copy(Path(b[name]["out"]) / "trials.parquet", tables / f"{name}.parquet")
        print(name, round(b[name]["command_s"], 2), b[name]["counts"],
              {k: round(v, 2) for k, v in b[name]["phases_s"].items()},
              b[name]["idle"], flush=True)
        save()
    if "no_prestart" not in skip:
        # Without the work begun before Ray is up: its compile times are then every
        # config's own (the replay input, benchmarks/tables/).
        name = "matmul600_1gpu_no_prestart"
        b[name] = command(with_workers(SPEC_600, 1), tmp, name, tmp / f"cache-{name}",
                          env_extra={"SWEEP_PRESTART": "0"})
        shutil.copy(Path(b[name]["out"]) / "trials.parquet", tables / f"{name}.parquet")
        print(name, round(b[name]["command_s"], 2),
              {k: round(v, 2) for k, v in b[name]["phases_s"].items()}, flush=True)
        save()
    if gpus >= 2:
        b["speedup_1_to_2"] = b["matmul600_1gpu"]["command_s"] / b["matmul600_2gpu"]["command_s"]


def retime_ok(a: dict) -> dict:
    """(c): every ok config of (a)'s first run re-timed interleaved on the device."""
    import pyarrow.parquet as pq

    from benchmarks.gpu_sweep import device_measurements

    rows = pq.read_table(Path(a["own_ray_empty"]["out"]) / "trials.parquet").to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    device = device_measurements([json.loads(r["config"]) for r in ok])
    device["retimed_indices"] = [r["index"] for r in ok]
    return device


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tables", type=Path, default=ROOT / "benchmarks" / "tables")
    ap.add_argument("--only", default="abc")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs of (a); (b) runs 1..gpus")
    ap.add_argument("--skip", default="", help="comma-separated: address, no_prestart")
    ap.add_argument("--name", default="", help="suffix of the result's name")
    args = ap.parse_args()
    from benchmarks import record
    from sweep.spec import load_spec

    skip = set(args.skip.split(","))
    result = record.header(f"time_to_answer_{args.gpus}gpu"
                           + ("" if args.only == "abc" else f"_{args.only}") + args.name)
    result["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout

    def save() -> None:  # after each part, so a run cut short still leaves its numbers
        record.write(result, args.out)

    base = yaml.safe_load((ROOT / "configs" / "matmul.yaml").read_text())
    space_a = load_spec(ROOT / "configs" / "matmul.yaml").expand()
    configs_a = [space_a.config(i) for i in range(len(space_a))]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "t" in args.only:
            result["t"] = {}
            targets(result["t"], base, configs_a, tmp, save)
        if "a" in args.only:
            result["a"] = {}
            autotune_runs(result["a"], base, configs_a, args.gpus, skip, tmp, save)
        if "b" in args.only:
            result["b"] = {}
            scaling_runs(result["b"], args.gpus, skip, args.tables, tmp, save)
        if "c" in args.only and "a" in result:
            result["device"] = retime_ok(result["a"])
    print(f"written {record.write(result, args.out)}")

if __name__ == "__main__":
    main()
