"""Which commit made healthy workers die on a kernel nobody here wrote (issue: a public
kernel made the driver kill healthy workers), and whether the fix holds, on one GPU.

Liger-Kernel 0.8.5's block RMSNorm over its 16 largest tiles (liger-rms-16.yaml, in
benchmarks/third_party/ or the folder --kernels names): `sweep run` as a user runs it,
with the code of each tree given (the commit before the fork server, the fork server's,
main before the fix, this checkout),
each with empty caches of its own. For each: the whole command, its exit code, the
"died running trial" lines and what they say. Then the mechanism alone: a process forked
after `import liger_kernel.ops` cannot start CUDA, unless PYTORCH_NVML_BASED_CUDA_CHECK=1
was set before the import.

Usage (on the GPU machine, liger-kernel importable):
    python3 benchmarks/fork_regression.py --out DIR [--tree NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import header, write  # noqa: E402

KERNELS = ROOT / "benchmarks" / "third_party"
SPEC = "liger-rms-16.yaml"

PROBE = """
import os, sys
import liger_kernel.ops.rms_norm  # noqa: F401  (its import asks torch.cuda.is_available())
pid = os.fork()
if pid == 0:
    import torch
    try:
        torch.zeros(1, device="cuda")
        print("child: CUDA works")
        os._exit(0)
    except Exception as e:
        print("child:", type(e).__name__, str(e).splitlines()[0])
        os._exit(1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_tree(name: str, tree: Path, out: Path, limit_s: float, kernels: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"fork-{name}-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                      if p and Path(p).resolve() != ROOT]]),
        "SWEEP_CACHE_DIR": str(work / "cache"), "TRITON_CACHE_DIR": str(work / "triton"),
        "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.monotonic()
    with open(out / f"{name}.out", "w") as stdout, open(out / f"{name}.err", "w") as stderr:
        try:
            code = subprocess.run([sys.executable, "-m", "sweep", "run", SPEC, "--out",
                                   str(work / "run")], cwd=kernels, env=env, stdout=stdout,
                                  stderr=stderr, timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            code = None
    wall = time.monotonic() - t0
    err = (out / f"{name}.err").read_text()
    died = [line for line in err.splitlines() if "died running trial" in line]
    summary = (out / f"{name}.out").read_text().splitlines()
    result = {"tree": str(tree), "exit_code": code, "whole_command_s": round(wall, 1),
              "deaths": len(died), "death_lines": died[:20],
              "summary": summary[:1], "notes": [line for line in err.splitlines()
                                               if "compile processes" in line][:5]}
    print(name, result, flush=True)
    return result


def probe(nvml: bool) -> dict:
    env = dict(os.environ)
    if nvml:
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=120)
    return {"nvml_check": nvml, "exit_code": done.returncode,
            "said": (done.stdout + done.stderr).strip().splitlines()[-1:]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--limit-s", type=float, default=150)
    p.add_argument("--kernels", type=Path, default=KERNELS,
                   help=f"the folder holding {SPEC} and its kernel module")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = header("fork_regression")
    result["probe"] = [probe(False), probe(True)]
    print(result["probe"], flush=True)
    trees = [t.split("=", 1) for t in args.tree] + [["this", str(ROOT)]]
    result["runs"] = {name: run_tree(name, Path(path).resolve(), args.out, args.limit_s,
                                     args.kernels.resolve()) for name, path in trees}
    print(write(result, args.out))


if __name__ == "__main__":
    main()
