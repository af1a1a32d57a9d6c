"""Third-party kernels on one GPU (the device tool's nvidia-h200): kernels from public
packages, wrapped as docs/kernels.md tells a user (benchmarks/third_party/),
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

This module is the driver: the command line, each kernel from its sweep to its comparison,
and the result file. The kernels and targets are in third_party_cases.py, running a
command in third_party_command.py, reading a run directory in third_party_rundir.py, the
comparison in third_party_compare.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.third_party_cases import CASES, Case, spec_for, targets  # noqa: E402
from benchmarks.third_party_command import Log, run_command, sweep_env  # noqa: E402
from benchmarks.third_party_compare import compare  # noqa: E402
from benchmarks.third_party_rundir import read_run, retried  # noqa: E402

# -- one kernel, start to end --------------------------------------------------------------

def run_case(case: Case, args: argparse.Namespace, tmp: Path, left: Callable[[], float],
             later: int, save: Callable[[], None], entry: dict[str, Any]) -> None:
    """later: cases still to come after this one (each keeps a share of the deadline)."""
    log = Log(args.out / f"{case.name}.log")
    try:
        run_dir = tmp / "runs" / case.name
        env = sweep_env(tmp / f"triton-cache-{case.name}", tmp / "sweep-cache", args.smoke)
        spec = spec_for(case, tmp, args.smoke)
        entry["spec"] = yaml.safe_load(spec.read_text())
        reserve = 75.0 * later + 60.0  # for the cases after this, and this one's comparison
        budget = min(case.budget_s, left() - reserve - 45.0)
        if budget < 30:
            entry["skipped"] = f"deadline: {left():.0f} s left"
            return
        first_pass(case, spec, run_dir, budget, log, env, entry)
        save()
        picks = first_picks(run_dir, entry, args.smoke)
        retry_budget = min(120.0, left() - reserve - 30.0)
        if entry["run"]["timeouts"]["compile_limited"]:
            if not args.retry or retry_budget < 45:
                entry["retry"] = {"skipped": "--no-retry" if not args.retry
                                  else f"deadline: {left():.0f} s left"}
            else:
                retry(case, run_dir, retry_budget, log, env, entry, picks)
                save()
        if not picks:
            entry["compare"] = {"skipped": "no best.json"}
            return
        timeout_s = max(60.0, min(240.0, left() - 75.0 * later))
        entry["compare"] = compare_picks(case, args, tmp, run_dir, picks, log, env, timeout_s)
        sp = entry["compare"].get("speedup_of_pick", {}).get("pick", {})
        print(f"{case.name}: pick vs {case.own}: {sp.get(case.own)}; all: {sp}", flush=True)
        save()
    finally:
        log.close()


def first_pass(case: Case, spec: Path, run_dir: Path, budget: float, log: Log,
               env: dict[str, str], entry: dict[str, Any]) -> None:
    """The whole `sweep run SPEC --out DIR --force` command, and what its run says."""
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


def first_picks(run_dir: Path, entry: dict[str, Any], smoke: bool) -> dict[str, Path]:
    """best.json as the first pass left it (a retry rewrites it), as "pick"."""
    picks: dict[str, Path] = {}
    if (run_dir / "best.json").exists():
        picks["pick"] = run_dir / "best-first-pass.json"
        shutil.copy(run_dir / "best.json", picks["pick"])
    if smoke and picks and not json.loads(picks["pick"].read_text()).get("config"):
        # Nothing worked under the interpreter (Liger's kernels cannot run there): a
        # stand-in pick, so that the comparison's own path is still exercised.
        last = entry["run"]["rows"][-1]  # the largest tiles: valid in these spaces
        picks["pick"].write_text(json.dumps({"config": last["config"],
                                             "index": last["index"], "stand_in": True}))
        entry["smoke_stand_in_pick"] = last["config"]
    return picks


def retry(case: Case, run_dir: Path, budget: float, log: Log, env: dict[str, str],
          entry: dict[str, Any], picks: dict[str, Path]) -> None:
    """`sweep resume DIR --retry timeout`, for the configs the compile limit stopped; a new
    best after it becomes "retry_pick"."""
    limited = [r["index"] for r in entry["run"]["timeouts"]["compile_limited"]]
    again = run_command([sys.executable, "-m", "sweep", "resume", run_dir, "--retry",
                         "timeout", "--time-budget", f"{budget:.0f}"],
                        log, env, timeout_s=budget + 90)
    entry["retry"] = {k: v for k, v in again.items() if k not in ("stdout", "stderr")}
    entry["retry"]["summary"] = again["stdout"][-30:]
    entry["retry"]["stderr_tail"] = again["stderr"][-30:]
    entry["retry"]["deaths_stderr"] = [x for x in again["stderr"] if "died" in x]
    entry["retry"]["compile_limited"] = retried(
        run_dir, limited, entry["run"]["timeouts"]["ok_best_latency_ms"])
    after = json.loads((run_dir / "best.json").read_text())
    entry["retry"]["best_after"] = {k: after.get(k) for k in ("index", "config", "latency_ms")}
    if after.get("index") != entry["run"].get("best", {}).get("index"):
        picks["retry_pick"] = run_dir / "best-after-retry.json"
        shutil.copy(run_dir / "best.json", picks["retry_pick"])
    print(f"{case.name}: retry {again['command_s']:.1f} s "
          f"{entry['retry']['compile_limited']['ok']} of {len(limited)} ok", flush=True)


def compare_picks(case: Case, args: argparse.Namespace, tmp: Path, run_dir: Path,
                  picks: dict[str, Path], log: Log, env: dict[str, str],
                  timeout_s: float) -> dict[str, Any]:
    """This script's --compare, in a process of its own (a fresh CUDA context, the
    package's imports and autotuner apart from this one); its result, or why none."""
    result_path = tmp / f"compare-{case.name}.json"
    argv = [sys.executable, Path(__file__), "--compare", case.name, "--run", run_dir,
            "--result", result_path, "--rounds", str(args.rounds)]
    for name, path in picks.items():
        argv += ["--pick", f"{name}={path}"]
    if args.smoke:
        argv.append("--smoke")
    done = run_command(argv, log, env, timeout_s=timeout_s, cwd=ROOT)
    result = (json.loads(result_path.read_text()) if result_path.exists()
              else {"failed": done["rc"], "stderr_tail": done["stderr"][-30:]})
    result["command_s"] = done["command_s"]
    return result


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


# -- what the result says of the machine and the checkout ----------------------------------

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


# -- the command line ----------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
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
    return ap


def main() -> None:
    ap = parser()
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
