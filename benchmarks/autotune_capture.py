"""The kernels users already have, on one GPU: a real program's `@triton.autotune` calls
under Triton's own autotune against `sweep capture` + `sweep run` + `sweep exec`, each
command timed whole as a user times it (issue 35, item 5).

Per program (benchmarks/programs/):
(b) runs first (where it fails, the baseline's minutes are not spent), then (a).
(a) baseline: `python PROG ARGS` with an empty TRITON_CACHE_DIR of its own, Triton tuning
    every key in-process on the first step; its picks read from TRITON_PRINT_AUTOTUNING=1.
    TRITON_CACHE_AUTOTUNING=1 keeps them on disk, so that (c)'s later runs under Triton's
    picks reuse them instead of tuning again (the first run tunes as without it).
(b) ours, another empty TRITON_CACHE_DIR shared by the three commands (as a user's one
    machine has): `sweep capture --no-tune --out CAP -- python PROG ARGS`, then
    `sweep run CAP/spec.yaml --out RUN`, then `sweep exec RUN -- python PROG ARGS`; each
    whole command's wall time and their sum (target: <= 60 s).
(c) the steady step (the program's median of 5, synchronised) with the run loaded against
    under Triton's picks: (a) against (b)'s exec, then --rounds more pairs, interleaved
    (A B, B A, ...) while the deadline allows (target: ours / theirs <= 1.02).
(d) per tuned key: the pick's first-pass latency against the fastest of every config in
    RUN/trials.parquet (the run times them all; target: within 2%), and where Triton's own
    pick stands among the same trials.

Usage (on the GPU machine, the packages importable, e.g. their wheels in /tmp/site and
PYTHONPATH=/tmp/site):
    python3 benchmarks/autotune_capture.py --out DIR [--only liger_moe,fla] [--rounds 2]
        [--deadline-s 560] [--run-limit-s 240] [--name autotune_capture] [--args NAME="ARGS"]
        [--commit SHA]
Writes as it goes: DIR/NAME.log per program (every command's lines), DIR/runs-NAME.tar.gz
(the capture and the run directory) and DIR/autotune_capture-DATE.json, the same JSON
under --results (default benchmarks/results). --cpu (a dry run): the tiny program
(benchmarks/programs/tiny_step.py) on the CPU under Triton's interpreter, every step above,
to check this script without a GPU; its JSON goes under --out only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402
from benchmarks.autotune_capture_keys import (  # noqa: E402
    per_key,
    program_lines,
    steady_pairs,
    triton_picks,
)
from benchmarks.third_party import commit  # noqa: E402
from benchmarks.third_party_command import Log, run_command  # noqa: E402

TARGET_OURS_S = 60.0
PY = sys.executable


@dataclass(frozen=True)
class Program:
    name: str
    script: str  # relative to the checkout
    args: str  # on the GPU
    cpu_args: str = ""  # under --cpu (the tiny program only)


PROGRAMS = (
    Program("liger_moe", "benchmarks/programs/liger_moe_step.py",
            "--tokens 256,1024 --experts 8,16"),
    Program("fla", "benchmarks/programs/fla_step.py", "--seq 4096,16384"),
    Program("tiny", "benchmarks/programs/tiny_step.py", "--sizes 1000,100000 --device cuda",
            "--sizes 100,1000 --device cpu"),
)


class Context:
    """What every step of one invocation shares: its options, scratch folder and clock."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp, self.start = args, tmp, time.monotonic()

    def left(self) -> float:
        return float(self.args.deadline_s) - (time.monotonic() - self.start)

    def env(self, program: str, triton_cache: str, *, triton_picks: bool) -> dict[str, str]:
        """The caller's environment (the wheels on PYTHONPATH) with this checkout importable,
        a Triton cache of the step's own, and a best-config cache apart from the user's."""
        path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SWEEP_AUTOTUNE", "TRITON_CACHE_AUTOTUNING",
                                     "LIGER_FUSED_MOE_AUTOTUNE"))}
        env.update(PYTHONPATH=os.pathsep.join([*path, str(ROOT)]), PYTHONUNBUFFERED="1",
                   RAY_USAGE_STATS_ENABLED="0", TRITON_PRINT_AUTOTUNING="1",
                   TRITON_CACHE_DIR=str(self.tmp / program / triton_cache),
                   SWEEP_CACHE_DIR=str(self.tmp / program / "sweep-cache"))
        if triton_picks:
            env["TRITON_CACHE_AUTOTUNING"] = "1"
        if self.args.cpu:
            env["TRITON_INTERPRET"] = "1"
        return env


def timed(argv: list[Any], log: Log, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """One whole command, as a user times it, and what its output says."""
    done = run_command(argv, log, env, timeout_s=max(timeout_s, 5.0), cwd=ROOT)
    return {"argv": done["argv"], "rc": done["rc"], "command_s": done["command_s"],
            "stopped_by_benchmark": done["stopped_by_benchmark"],
            "program": program_lines(done["stdout"]),
            "triton_tuned": triton_picks(done["stdout"]),
            "stdout_tail": done["stdout"][-15:], "stderr_tail": done["stderr"][-25:]}


def program_argv(program: Program, args: argparse.Namespace) -> list[str]:
    given = dict(a.partition("=")[::2] for a in args.args)
    text = given.get(program.name, program.cpu_args if args.cpu else program.args)
    return [PY, str(ROOT / program.script), *shlex.split(text)]


# -- one program, start to end --------------------------------------------------------------

def run_program(program: Program, ctx: Context, entry: dict[str, Any],
                save: Callable[[], None]) -> None:
    log = Log(ctx.args.out / f"{program.name}.log")
    try:
        prog = program_argv(program, ctx.args)
        entry["argv"] = prog
        # Ours first: where it fails, the baseline's minutes of tuning are not spent.
        ours(program, prog, ctx, log, entry, save)
        if entry["ours"].get("failed_at"):
            return
        base_env = ctx.env(program.name, "triton-baseline", triton_picks=True)
        entry["baseline"] = timed(prog, log, base_env, ctx.left() - 60)
        entry["baseline"]["triton_cache"] = "empty at start; TRITON_CACHE_AUTOTUNING=1"
        summary(program.name, "baseline", entry["baseline"])
        save()
        run_dir = ctx.tmp / program.name / "run"
        if (run_dir / "best.json").exists():
            entry["per_key"] = per_key(run_dir, entry["baseline"]["triton_tuned"])
            entry["per_key_summary"] = key_summary(entry["per_key"])
            save()
        rounds(prog, ctx, log, entry, save, run_dir)
        entry["targets"] = targets(entry)
        save()
    finally:
        log.close()
        pack(ctx.tmp / program.name, ctx.args.out / f"runs-{program.name}.tar.gz")


def ours(program: Program, prog: list[str], ctx: Context, log: Log, entry: dict[str, Any],
         save: Callable[[], None]) -> None:
    """(b): capture, run, exec, each whole; stops at the first that fails."""
    here = ctx.tmp / program.name
    env = ctx.env(program.name, "triton-ours", triton_picks=False)
    cap, run_dir = here / "capture", here / "run"
    steps = (("capture", [PY, "-m", "sweep", "capture", "--no-tune", "--out", cap, "--",
                          *prog]),
             ("run", [PY, "-m", "sweep", "run", cap / "spec.yaml", "--out", run_dir]),
             ("exec", [PY, "-m", "sweep", "exec", run_dir, "--", *prog]))
    got: dict[str, Any] = entry.setdefault("ours", {})
    got["triton_cache"] = "one, empty at start, shared by capture, run and exec"
    for name, argv in steps:
        reserve = 30.0 if name == "exec" else 60.0
        limit = ctx.args.run_limit_s if name == "run" else ctx.left()
        got[name] = timed(argv, log, env, min(limit, ctx.left() - reserve))
        summary(program.name, name, got[name])
        if name == "capture" and (cap / "spec.yaml").exists():
            got["spec_yaml"] = (cap / "spec.yaml").read_text().splitlines()[:400]
        save()
        if got[name]["rc"] != 0:
            got["failed_at"] = name
            break
    got["total_s"] = sum(got[n]["command_s"] for n, _ in steps if n in got)


def rounds(prog: list[str], ctx: Context, log: Log, entry: dict[str, Any],
           save: Callable[[], None], run_dir: Path) -> None:
    """(c): (a) against (b)'s exec, then interleaved pairs while time allows."""
    name = Path(prog[1]).stem
    first = entry["baseline"]["program"], entry.get("ours", {}).get("exec", {}).get("program")
    if not first[0] or not first[1]:
        entry["steady"] = {"skipped": "no baseline or no exec output to compare"}
        return
    theirs, mine = [first[0]], [first[1]]
    extra: list[dict[str, Any]] = []
    program = entry["program_name"]
    env_t = ctx.env(program, "triton-baseline", triton_picks=True)
    env_o = ctx.env(program, "triton-ours", triton_picks=False)
    last_exec = entry["ours"]["exec"]["command_s"]
    for r in range(ctx.args.rounds):
        cost = sum(e["command_s"] for e in extra[-2:]) if extra else 2.0 * last_exec
        if ctx.left() < cost + 20:
            entry["steady_rounds_skipped"] = f"deadline: {ctx.left():.0f} s left at round {r}"
            break
        pair = [("triton", prog, env_t), ("ours", [PY, "-m", "sweep", "exec", run_dir, "--",
                                                    *prog], env_o)]
        for which, argv, env in pair if r % 2 == 0 else reversed(pair):
            # Past 3x the loaded run's time, Triton is tuning again (its disk cache missed).
            done = timed(argv, log, env, min(ctx.left() - 15, max(60.0, 3 * last_exec)))
            done["which"] = which
            extra.append(done)
            if done["program"]:
                (theirs if which == "triton" else mine).append(done["program"])
        save()
    entry["steady_runs"] = [{k: e[k] for k in ("which", "rc", "command_s", "triton_tuned")}
                            for e in extra]
    n = min(len(theirs), len(mine))
    entry["steady"] = steady_pairs(theirs[:n], mine[:n])
    print(f"{name}: steady ours/triton {[round(s['median_ratio'], 3) for s in entry['steady']]}",
          flush=True)


def summary(program: str, step: str, done: dict[str, Any]) -> None:
    firsts = [round(p.get("first_step_s", 0.0), 2) for p in done["program"]]
    print(f"{program}: {step} {done['command_s']:.1f} s rc {done['rc']} first steps {firsts} "
          f"triton tuned {len(done['triton_tuned'])} keys", flush=True)


def key_summary(keys: list[dict[str, Any]]) -> dict[str, Any]:
    margins = [k["pick"]["margin"] for k in keys if "pick" in k]
    theirs = [k["triton_pick"]["margin"] for k in keys
              if "margin" in k.get("triton_pick", {})]
    return {"keys": len(keys), "picked": len(margins),
            "within_2pct": sum(m <= 0.02 for m in margins),
            "worst_margin": max(margins, default=None),
            "triton_worst_margin": max(theirs, default=None)}


def targets(entry: dict[str, Any]) -> dict[str, Any]:
    got = entry.get("ours", {})
    base = entry.get("baseline", {})
    steady = entry.get("steady")
    ratios = [s["median_ratio"] for s in steady] if isinstance(steady, list) else []
    out: dict[str, Any] = {
        "baseline_s": base.get("command_s"), "ours_s": got.get("total_s"),
        "ours_le_60s": got.get("total_s") is not None and "failed_at" not in got
        and got["total_s"] <= TARGET_OURS_S,
        "speedup": (base["command_s"] / got["total_s"] if base.get("command_s")
                    and got.get("total_s") and "failed_at" not in got else None),
        "steady_ratios": ratios, "steady_within_2pct": bool(ratios)
        and all(r <= 1.02 for r in ratios),
        "exec_triton_tuned": len(got.get("exec", {}).get("triton_tuned", [])),
        "capture_triton_tuned": len(got.get("capture", {}).get("triton_tuned", [])),
    }
    if "per_key_summary" in entry:
        s = entry["per_key_summary"]
        out["keys_within_2pct"] = f"{s['within_2pct']} of {s['picked']}"
    return out


def pack(folder: Path, to: Path) -> None:
    """The capture and the run directory (files up to 8 MB), in one file: few files come
    back from a device call."""
    if not folder.exists():
        return
    part = to.with_name(to.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        for sub in ("capture", "run"):
            for f in sorted((folder / sub).rglob("*")):
                if f.is_file() and f.stat().st_size <= 8 << 20:
                    tar.add(f, arcname=str(f.relative_to(folder)))
    part.replace(to)


# -- the machine and the checkout ------------------------------------------------------------

def hardware() -> dict[str, Any]:
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    for key, argv in (("nvidia_smi_L", ["nvidia-smi", "-L"]),
                      ("gpus", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                "--format=csv,noheader"])):
        try:
            smi = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            out[key] = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired) as e:
            out[key] = [f"nvidia-smi failed: {type(e).__name__}"]
    return out


def package_versions() -> dict[str, str]:
    out = {}
    for dist in ("liger-kernel", "fla-core", "einops", "pyarrow", "pyyaml"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


# -- the command line -----------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="logs, tarballs, the JSON ($OUT)")
    ap.add_argument("--results", type=Path, default=None,
                    help="also write the JSON here (default benchmarks/results; none --cpu)")
    ap.add_argument("--only", default="liger_moe,fla",
                    help="programs: " + ",".join(p.name for p in PROGRAMS))
    ap.add_argument("--args", action="append", default=[], metavar='NAME="ARGS"',
                    help="a program's arguments instead of its defaults")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved steady-step pairs")
    ap.add_argument("--run-limit-s", type=float, default=240.0,
                    help="`sweep run` past this gets SIGINT (it stops resumably, its best kept)")
    ap.add_argument("--deadline-s", type=float, default=560.0,
                    help="the whole script's time; later steps are skipped to fit it")
    ap.add_argument("--name", default=None, help="the result's name (default autotune_capture)")
    ap.add_argument("--commit", default=None, help="this checkout's commit, where no .git is")
    ap.add_argument("--cpu", "--dry-run", dest="cpu", action="store_true",
                    help="no GPU: the tiny program under Triton's interpreter")
    return ap


WARM_UP = {"liger_moe": "liger_kernel.ops.fused_moe", "fla": "fla"}


def warm_up(chosen: list[str]) -> float:
    """One untimed import of torch, triton, this project and each program's package first:
    the arm timed first would otherwise pay for reading them from a cold disk alone (seen:
    13.8 s against 7.3 s for the same imports)."""
    modules = ["torch", "triton", "sweep.autotune.use", *(WARM_UP[p] for p in chosen
                                                          if p in WARM_UP)]
    t0 = time.monotonic()
    subprocess.run([PY, "-c", "import " + ", ".join(modules)], check=False)
    return time.monotonic() - t0


def main() -> None:
    args = parser().parse_args()
    by_name = {p.name: p for p in PROGRAMS}
    chosen = ["tiny"] if args.cpu else [n for n in args.only.split(",") if n]
    unknown = [n for n in chosen if n not in by_name]
    if unknown:
        parser().error(f"--only: unknown program {unknown[0]!r}")
    if args.results is None and not args.cpu:
        args.results = ROOT / "benchmarks" / "results"
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name or ("autotune_capture_cpu" if args.cpu else "autotune_capture")
    result = record.header(name)
    result["versions"].update(package_versions())
    result.update(hardware=hardware(), commit=commit(args.commit), argv=sys.argv,
                  deadline_s=args.deadline_s, programs={})

    def save() -> None:  # after each step, so a call cut short still leaves its numbers
        result["elapsed_s"] = time.monotonic() - ctx.start
        record.write(result, args.out)
        if args.results is not None and args.results.resolve() != args.out.resolve():
            record.write(result, args.results)

    with tempfile.TemporaryDirectory(prefix="autotune-capture-") as tmp:
        ctx = Context(args, Path(tmp))
        result["warm_up_s"] = warm_up(chosen)
        save()
        for program in chosen:
            entry = result["programs"].setdefault(program, {"program_name": program})
            try:
                run_program(by_name[program], ctx, entry, save)
            except Exception as e:  # the next program still runs; this one says why
                entry["failed"] = f"{type(e).__name__}: {e}"
                print(f"{program}: failed: {entry['failed']}", flush=True)
            save()
    for program, entry in result["programs"].items():
        print(f"{program}: {entry.get('targets') or entry.get('failed')}")
    print(f"written under {args.out} (elapsed {result['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
