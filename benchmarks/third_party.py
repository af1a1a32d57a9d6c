"""Third-party kernels on one GPU (the device tool's nvidia-h200): kernels from public
packages, wrapped as README's "Your own kernel" tells a user (benchmarks/third_party/),
each tuned with the whole `sweep run SPEC --out DIR --force` command, and the pick timed
against the package's own launch config.

(a) Liger-Kernel 0.8.5's block RMSNorm forward, 65536 x 4096 bfloat16, 324 configs.
(b) Liger-Kernel 0.8.5's LayerNorm forward, three outputs (Y, Mean, RSTD), 72 configs.
(c) fla-core 0.6.0's chunk_fwd_kernel_o (chunked linear attention's output stage),
    8 x 4096 tokens, 16 heads, K = V = 128, 108 configs.

For each, from the command's launch to its exit as a user times it (Ray's start and
stop included), and from the run directory it leaves: trials/s, counts by status, worker
deaths (attempts.jsonl's "died" lines, and the progress lines on stderr that say `died
running trial`), timeouts, and what the compile limit stopped: those rows' configs and
compile times against the compile_ms distribution of the rest, how fast their one-step
neighbours ran, and, where time allows, `sweep resume DIR --retry timeout`, which compiles
and times them after all (were they slow ones?). Then, in a process of its own, on one
set of inputs: the pick (best.json's config, from before any retry) and the package's
own launches, each validated against the kernel's reference first, timed interleaved
(A B A B ..., triton.testing.do_bench(warmup=25, rep=100) median, --rounds rounds).

Targets: Liger RMSNorm, 324 configs: whole command <= 60 s, 0 worker deaths, pick >= 1.5x
faster than Liger's own launch config.

Usage (on the GPU machine, with the packages importable, e.g. their wheels installed into
/tmp/site and PYTHONPATH=/tmp/site):
    python3 benchmarks/third_party.py --out DIR [--results DIR] [--only NAME,...]
        [--deadline-s 420] [--rounds 7] [--commit SHA]
Writes, as it goes: DIR/NAME.log per kernel (its commands' stdout and stderr, line by
line), DIR/runs.tar.gz (the run directories), DIR/third_party-DATE.json and the same JSON
under --results (default benchmarks/results). Names: liger_rms, liger_layer_norm,
fla_chunk_o. Without a GPU, --smoke runs every step on tiny float32 problems under
Triton's interpreter (timed by the wall clock), to check this script.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks" / "third_party"  # the kernel modules and specs; sweeps run here
sys.path.insert(0, str(ROOT))

TARGET_COMMAND_S = 60.0
TARGET_SPEEDUP = 1.5
STOP_GRACE_S = 60.0  # after SIGINT, before SIGKILL, for a command past its time limit


@dataclass(frozen=True)
class Case:
    name: str  # the kernel module in benchmarks/third_party/, and its log's name
    spec: str  # its spec there
    package: str  # the distribution it comes from
    budget_s: float  # --time-budget of its sweep
    own: str  # the package_launches entry that is "the package's own launch config"
    smoke: dict[str, Any] = field(default_factory=dict)  # spec keys replaced for --smoke


CASES = (
    Case("liger_rms", "liger-rms-324.yaml", "liger-kernel", 150, "liger", smoke={
        "problem": {"n_rows": 8, "n_cols": 64, "dtype": "float32"},
        "space": {"BLOCK_SIZE": [32, 64, 128], "BLOCK_ROW": [1, 4], "num_warps": [4],
                  "num_stages": [1]}}),
    Case("liger_layer_norm", "liger-layer-norm.yaml", "liger-kernel", 90, "liger", smoke={
        "problem": {"n_rows": 8, "n_cols": 64, "dtype": "float32"},
        "space": {"BLOCK_SIZE": [32, 64, 128], "num_warps": [1, 4], "num_stages": [1]}}),
    Case("fla_chunk_o", "fla-chunk-o.yaml", "fla-core", 120, "fla", smoke={
        "problem": {"B": 1, "T": 40, "H": 1, "HV": 2, "K": 32, "V": 48, "chunk_size": 16,
                    "dtype": "float32"},
        "fixed": {"H": 1, "HV": 2, "K": 32, "V": 48, "BT": 16},
        "space": {"BK": [16, 32], "BV": [16, 32, 64], "num_warps": [2],
                  "num_stages": [1, 2]}}),
)


# -- running a command as a user does ------------------------------------------------------

class Log:
    """One kernel's log under --out: every line of its commands as it comes, so a call
    killed at its time limit keeps what it did."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", buffering=1)
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            self.file.write(text if text.endswith("\n") else text + "\n")
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_command(argv: Sequence[str], log: Log, env: dict[str, str], timeout_s: float,
                cwd: Path = HERE) -> dict[str, Any]:
    """argv from launch to exit: its wall clock, exit code and lines (also to the log,
    each marked with its stream and seconds since launch). Past timeout_s it gets SIGINT
    (a sweep then stops resumably, writing everything), then SIGKILL."""
    log.write(f"==== {time.strftime('%H:%M:%S')} {' '.join(map(str, argv))}")
    launched, t0 = time.time(), time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, text=True, bufsize=1,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    lines: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def pump(stream: Any, name: str) -> None:
        for line in stream:
            line = line.rstrip("\n")
            lines[name].append(line)
            log.write(f"[{time.monotonic() - t0:7.1f} s {name[3:]}] {line}")

    pumps = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
    for p in pumps:
        p.start()
    stopped = None
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stopped = "SIGINT"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # the group this call started for it
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            stopped = "SIGKILL"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    exited = time.monotonic()
    for p in pumps:
        p.join(timeout=10)
    log.write(f"==== exit {proc.returncode} after {exited - t0:.1f} s"
              + (f" (stopped by this script: {stopped})" if stopped else ""))
    return {"argv": [str(a) for a in argv], "rc": proc.returncode, "command_s": exited - t0,
            "launched_at": launched, "stopped_by_benchmark": stopped,
            "stdout": lines["stdout"], "stderr": lines["stderr"]}


def sweep_env(cache: Path, sweep_cache: Path, smoke: bool) -> dict[str, str]:
    """The caller's environment (PYTHONPATH with the packages' wheels, say) plus an empty
    Triton cache of the sweep's own, a best-config cache apart from the user's, and this
    checkout importable for `python -m sweep` wherever it is not installed."""
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "SWEEP_CACHE_DIR": str(sweep_cache),
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    return env


# -- reading a run directory ---------------------------------------------------------------

def quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)

    def at(q: float) -> float:
        return v[min(len(v) - 1, round(q * (len(v) - 1)))]

    return {"n": len(v), "min": v[0], "p10": at(0.1), "p50": at(0.5), "p90": at(0.9),
            "p99": at(0.99), "max": v[-1], "mean": statistics.fmean(v)}


def compile_limited(row: dict[str, Any]) -> bool:
    return row["status"] == "timeout" and (row["error"] or "").startswith("compile")


def neighbours(config: dict[str, Any], ok: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ok rows whose config differs from config in exactly one parameter."""
    return [r for r in ok
            if sum(r["params"].get(k) != v for k, v in config.items()) == 1]


def read_run(run_dir: Path, command: dict[str, Any]) -> dict[str, Any]:
    """What DIR says of the run, with the command's wall clock and stderr."""
    import pyarrow.parquet as pq

    out: dict[str, Any] = {"run_dir": str(run_dir)}
    snap_path = run_dir / "snapshot.json"
    if snap_path.exists():
        snap = json.loads(snap_path.read_text())["snapshot"]
        launched = command["launched_at"]
        out.update(state=snap["state"], total=snap["total"], done=snap["done"],
                   snapshot_counts=snap["counts"],
                   timeline_s={k: round(v - launched, 3) for k, v in
                               sorted(snap["timeline"].items(), key=lambda kv: kv[1])},
                   table_written_s=snap["written_at"] - launched)
    if (run_dir / "best.json").exists():
        best = json.loads((run_dir / "best.json").read_text())
        out["best"] = {k: best.get(k) for k in ("index", "config", "latency_ms", "device",
                                                "partial", "finalists", "baseline")}
    rows: list[dict[str, Any]] = []
    if (run_dir / "trials.parquet").exists():
        rows = pq.read_table(run_dir / "trials.parquet").to_pylist()
    for r in rows:
        r["params"] = json.loads(r["config"])
    ran = [r for r in rows if r["status"] != "pruned"]
    counts: dict[str, int] = {}
    for r in ran:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    out["counts"] = counts
    out["trials"] = len(ran)
    out["trials_per_s"] = len(ran) / command["command_s"] if command["command_s"] else None
    if ran:
        span = (max(r["finished_at"] for r in ran) - min(r["started_at"] for r in ran))
        span_s = span.total_seconds()
        out["trials_span_s"] = span_s
        out["trials_per_s_in_span"] = len(ran) / span_s if span_s > 0 else None
    out["retried_rows"] = [{"index": r["index"], "attempt": r["attempt"],
                            "status": r["status"]} for r in ran if r["attempt"] > 1]

    # Worker deaths, as the run recorded them and as the user saw them.
    died = []
    if (run_dir / "attempts.jsonl").exists():
        for line in (run_dir / "attempts.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "died":
                    died.append({k: entry.get(k) for k in ("index", "attempt", "why")})
    stderr = command["stderr"]
    out["deaths"] = {
        "attempts_died": died,
        "stderr_died_running_trial": [x for x in stderr if "died running trial" in x],
        "stderr_died_while_starting": [x for x in stderr if "died while starting" in x],
        "stderr_no_progress": [x for x in stderr if "made no progress" in x],
    }
    out["deaths"]["count"] = max(len(died), len(out["deaths"]["stderr_died_running_trial"]))

    # Timeouts, and what the compile limit stopped against the compiles it let through.
    ok = [r for r in ran if r["status"] == "ok"]
    best_ok = min((r["latency_ms"] for r in ok), default=None)
    limited = [r for r in ran if compile_limited(r)]
    others = [r for r in ran if r["compile_ms"] is not None and not compile_limited(r)]
    limits = []  # the adaptive limit moves as compiles end: each one it stopped at
    for r in limited:
        m = re.search(r"limit of ([\d.]+) s", r["error"] or "")
        p90 = re.search(r"p90 of ([\d.e+-]+) s", r["error"] or "")
        seen = {"limit_s": float(m.group(1)) if m else None,
                "p90_s": float(p90.group(1)) if p90 else None}
        if seen not in limits:
            limits.append(seen)
    stopped = []
    for r in limited:
        near = neighbours(r["params"], ok)
        fastest = min(near, key=lambda n: n["latency_ms"]) if near else None
        stopped.append({
            "index": r["index"], "config": r["params"], "compile_ms": r["compile_ms"],
            "error": (r["error"] or "")[:300], "neighbours_ok": len(near),
            "fastest_neighbour": None if fastest is None else {
                "index": fastest["index"], "config": fastest["params"],
                "latency_ms": fastest["latency_ms"],
                "vs_best": fastest["latency_ms"] / best_ok if best_ok else None}})
    ok_latency = [r["latency_ms"] for r in ok]
    out["timeouts"] = {
        "total": counts.get("timeout", 0),
        "compile_limited": stopped,
        "other": [{"index": r["index"], "config": r["params"], "error": (r["error"] or "")[:300]}
                  for r in ran if r["status"] == "timeout" and not compile_limited(r)],
        "limits": limits,
        # Were they slow ones? How the fastest ok config one parameter away from each ran,
        # against the best of the run (1.0: as fast as the best).
        "fastest_neighbour_vs_best": quantiles([x["fastest_neighbour"]["vs_best"]
                                                for x in stopped if x["fastest_neighbour"]]),
        "compile_ms_of_the_rest": quantiles([r["compile_ms"] for r in others]),
        # Compiles under 50 ms found their binary in Triton's cache (README: Compile limit).
        "compile_ms_of_the_rest_over_50ms": quantiles([r["compile_ms"] for r in others
                                                       if r["compile_ms"] >= 50]),
        "ok_latency_ms": quantiles(ok_latency),
        "ok_best_latency_ms": best_ok,
    }
    out["statuses_by_parameter"] = by_parameter(ran)
    out["errors_sample"] = sorted({(r["error"] or "")[:160] for r in ran if r["error"]})[:8]
    out["rows"] = [{k: r[k] for k in ("index", "status", "latency_ms", "compile_ms",
                                       "attempt", "worker")} | {"config": r["params"]}
                   for r in rows]
    return out


def by_parameter(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
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


# -- the pick against the package's own launches (in a process of its own) ---------------

def compare(case: Case, run_dir: Path, picks: dict[str, Path], rounds: int,
            smoke: bool) -> dict[str, Any]:
    """Validate, then time interleaved: each pick (a best.json) and the package's own
    launches, on one set of inputs, in this process."""
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(HERE))
    import torch

    from actors.triton_backend import outputs
    from sweep.spec import load_spec

    if smoke:
        from check_cpu import interpretable_liger  # the interpreter's stand-ins, see there

        interpretable_liger()
    module = importlib.import_module(case.name)
    kernel = module.KERNEL
    spec = load_spec(run_dir / "spec.yaml")
    problem, fixed = dict(spec.problem), dict(spec.fixed)
    tol = spec.validation
    rtol, atol = (tol.rtol, tol.atol) if tol else (0.01, 0.01)
    if hasattr(module, "check_fixed") and module.check_fixed(problem, fixed):
        raise SystemExit(f"spec and problem disagree: {module.check_fixed(problem, fixed)}")
    device = "cpu" if smoke else "cuda"
    if smoke and case.name == "fla_chunk_o":
        # fla's autotuner benchmarks its configs, which needs a GPU: held to one here.
        module.DECORATED.fn.configs = module.DECORATED.fn.configs[-1:]
    inputs = kernel.make_inputs(problem, device, 0)
    expected = outputs(kernel.reference(inputs, problem))

    Candidate = tuple[Callable[[], None], dict[str, Any], Callable[[], tuple[Any, ...]]]
    candidates: dict[str, Candidate] = {}
    for name, path in picks.items():
        best = json.loads(path.read_text())
        if best.get("config") is None:
            continue
        config = dict(best["config"])
        args, out = kernel.launch_args(inputs, problem)
        keywords = {**fixed, **config}
        grid = kernel.grid(problem, keywords)

        def launch(args: Any = args, keywords: dict = keywords, grid: Any = grid) -> None:
            kernel.fn[grid](*args, **keywords)

        candidates[name] = (launch, {"index": best.get("index"), **config},
                            lambda out=out: outputs(out))
    candidates.update(module.package_launches(inputs, problem))
    if kernel.baseline is not None:
        held: list[Any] = []

        def torch_own() -> None:
            held[:] = [kernel.baseline(inputs, problem)]

        candidates["torch"] = (torch_own, {"of": "the kernel's baseline"}, lambda: tuple(held))

    sync = torch.cuda.synchronize if not smoke else (lambda: None)
    checked: dict[str, dict[str, Any]] = {}
    for name, (launch, config, filled) in candidates.items():
        entry: dict[str, Any] = {"config": config}
        try:
            for t in filled():
                t.fill_(float("nan"))  # so an output never written cannot pass
            launch()
            sync()
            got = filled()
            want = expected[:len(got)]
            entry["max_abs_error"] = [(a.float() - b.float()).abs().max().item()
                                      for a, b in zip(got, want)]
            entry["valid"] = len(got) > 0 and all(
                torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol)
                for a, b in zip(got, want))
        except Exception as e:
            entry["valid"] = False
            entry["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        checked[name] = entry
        print(f"{name}: valid={entry['valid']} {config} {entry.get('max_abs_error')}"
              f" {entry.get('error', '')}", flush=True)

    timed = [n for n in candidates if checked[n]["valid"]]
    samples: dict[str, list[float]] = {n: [] for n in timed}
    if smoke:
        from actors.timing import time_wall

        def bench(fn: Callable[[], None]) -> float:
            return time_wall(fn, 1.0, 5.0, max_reps=3).median_ms
    else:
        import triton.testing

        def bench(fn: Callable[[], None]) -> float:
            return float(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                 return_mode="median"))
    for _ in range(rounds):
        for n in timed:  # A B C A B C ...: drift and heat fall on all alike
            samples[n].append(bench(candidates[n][0]))
    medians = {n: statistics.median(v) for n, v in samples.items()}
    for n in timed:
        checked[n].update(rounds_ms=samples[n], median_ms=medians[n])
        if kernel.bytes_moved:
            checked[n]["gb_per_s"] = kernel.bytes_moved(problem) / medians[n] / 1e6
        if kernel.flops:
            checked[n]["tflop_per_s"] = kernel.flops(problem) / medians[n] / 1e9
    speedups = {p: {n: medians[n] / medians[p] for n in timed if n not in picks}
                for p in picks if p in medians}
    return {"problem": problem, "fixed": fixed, "tolerance": [rtol, atol], "rounds": rounds,
            "timing": "wall clock (interpreter)" if smoke else
            "triton.testing.do_bench(warmup=25, rep=100), median; median over rounds",
            "device": "cpu-interpreter" if smoke else torch.cuda.get_device_name(0),
            "torch": torch.__version__, "candidates": checked, "speedup_of_pick": speedups,
            "own": case.own}


# -- one kernel, start to end --------------------------------------------------------------

def spec_for(case: Case, tmp: Path, smoke: bool) -> Path:
    if not smoke:
        return HERE / case.spec
    spec = yaml.safe_load((HERE / case.spec).read_text())
    spec.update(case.smoke)
    spec["name"] = f"{spec['name']}-smoke"
    spec["run"] = {**spec.get("run", {}), "backend": "interpret"}
    path = tmp / f"{case.name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_case(case: Case, args: argparse.Namespace, tmp: Path, left: Callable[[], float],
             later: int, save: Callable[[], None], entry: dict[str, Any]) -> None:
    """later: cases still to come after this one (each keeps a share of the deadline)."""
    log = Log(args.out / f"{case.name}.log")
    try:
        run_dir = tmp / "runs" / case.name
        cache = tmp / f"triton-cache-{case.name}"
        env = sweep_env(cache, tmp / "sweep-cache", args.smoke)
        spec = spec_for(case, tmp, args.smoke)
        entry["spec"] = yaml.safe_load(spec.read_text())
        reserve = 75.0 * later + 60.0  # for the cases after this, and this one's comparison
        budget = min(case.budget_s, left() - reserve - 45.0)
        if budget < 30:
            entry["skipped"] = f"deadline: {left():.0f} s left"
            return
        command = run_command([sys.executable, "-m", "sweep", "run", spec, "--out", run_dir,
                               "--force", "--time-budget", f"{budget:.0f}"],
                              log, env, timeout_s=budget + 90)
        entry["sweep"] = {k: v for k, v in command.items() if k not in ("stdout", "stderr")}
        entry["sweep"]["time_budget_s"] = budget
        entry["sweep"]["summary"] = command["stdout"][-40:]
        entry["sweep"]["stderr_tail"] = command["stderr"][-40:]
        entry["run"] = read_run(run_dir, command)
        print(f"{case.name}: sweep {command['command_s']:.1f} s rc {command['rc']} "
              f"{entry['run'].get('state')} {entry['run']['counts']} "
              f"deaths {entry['run']['deaths']['count']} "
              f"compile-limited {len(entry['run']['timeouts']['compile_limited'])}", flush=True)
        save()
        picks: dict[str, Path] = {}
        if (run_dir / "best.json").exists():
            picks["pick"] = run_dir / "best-first-pass.json"
            shutil.copy(run_dir / "best.json", picks["pick"])
        if args.smoke and picks and not json.loads(picks["pick"].read_text()).get("config"):
            # Nothing worked under the interpreter (Liger's kernels cannot run there): a
            # stand-in pick, so that the comparison's own path is still exercised.
            last = entry["run"]["rows"][-1]  # the largest tiles: valid in these spaces
            picks["pick"].write_text(json.dumps({"config": last["config"],
                                                 "index": last["index"], "stand_in": True}))
            entry["smoke_stand_in_pick"] = last["config"]

        limited = [r["index"] for r in entry["run"]["timeouts"]["compile_limited"]]
        retry_budget = min(120.0, left() - reserve - 30.0)
        if limited and args.retry and retry_budget >= 45:
            again = run_command([sys.executable, "-m", "sweep", "resume", run_dir, "--retry",
                                 "timeout", "--time-budget", f"{retry_budget:.0f}"],
                                log, env, timeout_s=retry_budget + 90)
            entry["retry"] = {k: v for k, v in again.items() if k not in ("stdout", "stderr")}
            entry["retry"]["summary"] = again["stdout"][-30:]
            entry["retry"]["stderr_tail"] = again["stderr"][-30:]
            entry["retry"]["deaths_stderr"] = [x for x in again["stderr"] if "died" in x]
            entry["retry"]["compile_limited"] = retried(
                run_dir, limited, entry["run"]["timeouts"]["ok_best_latency_ms"])
            after = json.loads((run_dir / "best.json").read_text())
            entry["retry"]["best_after"] = {k: after.get(k) for k in
                                            ("index", "config", "latency_ms")}
            if after.get("index") != entry["run"].get("best", {}).get("index"):
                picks["retry_pick"] = run_dir / "best-after-retry.json"
                shutil.copy(run_dir / "best.json", picks["retry_pick"])
            print(f"{case.name}: retry {again['command_s']:.1f} s "
                  f"{entry['retry']['compile_limited']['ok']} of {len(limited)} ok", flush=True)
            save()
        elif limited:
            entry["retry"] = {"skipped": "--no-retry" if not args.retry
                              else f"deadline: {left():.0f} s left"}

        if not picks:
            entry["compare"] = {"skipped": "no best.json"}
            return
        result_path = tmp / f"compare-{case.name}.json"
        argv = [sys.executable, Path(__file__), "--compare", case.name, "--run", run_dir,
                "--result", result_path, "--rounds", str(args.rounds)]
        for name, path in picks.items():
            argv += ["--pick", f"{name}={path}"]
        if args.smoke:
            argv.append("--smoke")
        done = run_command(argv, log, env, timeout_s=max(60.0, min(240.0, left() - 75.0 * later)),
                           cwd=ROOT)
        entry["compare"] = (json.loads(result_path.read_text()) if result_path.exists()
                            else {"failed": done["rc"], "stderr_tail": done["stderr"][-30:]})
        entry["compare"]["command_s"] = done["command_s"]
        sp = entry["compare"].get("speedup_of_pick", {}).get("pick", {})
        print(f"{case.name}: pick vs {case.own}: {sp.get(case.own)}; all: {sp}", flush=True)
        save()
    finally:
        log.close()


def pack(tmp: Path, out: Path) -> None:
    """The run directories (tables, best.json, snapshots, attempts, Ray's log) in one file:
    few files come back from a device call."""
    runs = tmp / "runs"
    if not runs.exists():
        return
    part = out / "runs.tar.gz.part"
    with tarfile.open(part, "w:gz") as tar:
        for f in sorted(runs.rglob("*")):
            if f.is_file() and f.stat().st_size <= 8 << 20 and not f.name.startswith(".sweep"):
                tar.add(f, arcname=str(f.relative_to(runs)))
    part.replace(out / "runs.tar.gz")


def targets(cases: dict[str, Any]) -> dict[str, Any]:
    rms = cases.get("liger_rms", {})
    run, sweep = rms.get("run", {}), rms.get("sweep", {})
    speed = rms.get("compare", {}).get("speedup_of_pick", {}).get("pick", {})
    command_s = sweep.get("command_s")
    complete = run.get("state") == "complete" and run.get("trials") == 324
    deaths = run.get("deaths", {})
    died = len(deaths.get("attempts_died", [])) + len(deaths.get("stderr_died_running_trial",
                                                                 []))
    return {
        "liger_rms_command_s": {"value": command_s, "target": f"<= {TARGET_COMMAND_S:g} s, "
                                "all 324 trials", "complete": complete,
                                "met": bool(command_s is not None and complete
                                            and command_s <= TARGET_COMMAND_S)},
        "liger_rms_worker_deaths": {
            "attempts_died": len(deaths.get("attempts_died", [])),
            "stderr_died_running_trial": len(deaths.get("stderr_died_running_trial", [])),
            "target": 0, "met": bool(run) and died == 0},
        "liger_rms_pick_speedup": {
            "vs_liger": speed.get("liger"), "vs_liger_block": speed.get("liger_block"),
            "vs_liger_function": speed.get("liger_function"), "target": TARGET_SPEEDUP,
            "met": speed.get("liger") is not None and speed["liger"] >= TARGET_SPEEDUP,
            "met_vs_liger_block": speed.get("liger_block") is not None
            and speed["liger_block"] >= TARGET_SPEEDUP,
            "note": "liger: what Liger's rms_norm_forward launches for 65536x4096 (its "
                    "one-row kernel, _rms_norm_forward_kernel); liger_block: the block "
                    "kernel at Liger's settings (BLOCK_ROW 16), the comparison of "
                    "the comparison made when the issue was filed"},
    }


def hardware(smoke: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
        out["gpus"] = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired) as e:
        out["gpus"] = [] if smoke else [f"nvidia-smi failed: {e}"]
    return out


def commit(given: str | None) -> str:
    if given:
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown (no git here; pass --commit)"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def package_versions(known: dict[str, str]) -> dict[str, str]:
    """The packages' versions, and the module's own __version__ where no distribution
    metadata says (a Ray from a bundle, say)."""
    out = {}
    for dist in ("liger-kernel", "fla-core", "einops", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    for key in ("torch", "triton", "ray"):
        if known.get(key) == "absent":
            try:
                out[key] = importlib.import_module(key).__version__
            except Exception as e:
                out[key] = f"absent ({type(e).__name__})"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, help="logs, runs.tar.gz and the result JSON ($OUT)")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--only", default=",".join(c.name for c in CASES))
    ap.add_argument("--deadline-s", type=float, default=420.0,
                    help="the whole script's time; budgets shrink to fit it")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--commit", default=None, help="this checkout's commit, where no .git is")
    ap.add_argument("--no-retry", dest="retry", action="store_false",
                    help="no `sweep resume --retry timeout` of what the compile limit stopped")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: tiny float32 problems under Triton's interpreter")
    # Internal: the comparison, in a process of its own.
    ap.add_argument("--compare", help=argparse.SUPPRESS)
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--pick", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    by_name = {c.name: c for c in CASES}
    if args.compare:
        picks = {p.partition("=")[0]: Path(p.partition("=")[2]) for p in args.pick}
        res = compare(by_name[args.compare], args.run, picks, args.rounds, args.smoke)
        args.result.write_text(json.dumps(res, indent=2) + "\n")
        return
    if args.out is None:
        ap.error("--out is required")
    from benchmarks import record

    chosen = [by_name[n] for n in args.only.split(",") if n]
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    def left() -> float:
        return args.deadline_s - (time.monotonic() - start)

    result = record.header("third_party_smoke" if args.smoke else "third_party")
    result["versions"].update(package_versions(result["versions"]))
    result.update(hardware=hardware(args.smoke), commit=commit(args.commit),
                  argv=sys.argv, deadline_s=args.deadline_s, cases={})

    def save() -> None:  # after each step, so a run cut short still leaves its numbers
        record.write(result, args.out)
        if args.results.resolve() != args.out.resolve():
            record.write(result, args.results)

    save()
    with tempfile.TemporaryDirectory(prefix="third-party-") as tmp_name:
        tmp = Path(tmp_name)
        for i, case in enumerate(chosen):
            entry = result["cases"].setdefault(case.name, {"package": case.package})
            try:
                run_case(case, args, tmp, left, len(chosen) - i - 1, save, entry)
            except Exception as e:  # the next kernel still runs; this one says why
                entry["failed"] = f"{type(e).__name__}: {e}"
                print(f"{case.name}: failed: {entry['failed']}", flush=True)
            result["targets"] = targets(result["cases"])
            result["elapsed_s"] = time.monotonic() - start
            save()
            pack(tmp, args.out)
    print(json.dumps(result["targets"], indent=2))
    print(f"written {args.out} and {args.results} (elapsed {time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()
