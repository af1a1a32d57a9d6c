"""(c) of benchmarks/shapes.py: `triton.autotune` over the same kernel function and the
same configs, as a user's script runs it: a fresh Python process (the AUTOTUNE script,
run with `python -c` from the repository root) that calls the eight sizes in turn and
prints a line a size, read back here into the result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.shapes_command import Config, child_env, run_child, tail

# A fresh process, as a user's script: the kernel function as the project imports it (a
# fresh process has launched it nowhere, so wrapping it needs no copy), every config of the
# space as a triton.Config, each size given its own configs by the early prune, the sizes
# called in turn. One line a size, so a process stopped at its limit still reports some.
AUTOTUNE = r"""
import json, sys, time
started = time.time()
job = json.load(open(sys.argv[1]))
import torch, triton
from sweep_kernels.matmul import KERNEL, matmul_kernel
names = job["names"]
LAUNCH = ("num_warps", "num_stages")
def key(d):
    return json.dumps({k: d[k] for k in names}, sort_keys=True)
def as_config(c):
    launch = {k: c[k] for k in LAUNCH if k in c}
    return triton.Config({k: v for k, v in c.items() if k not in LAUNCH}, **launch)
def config_dict(cfg):
    return {k: v for k, v in {**cfg.kwargs, "num_warps": cfg.num_warps,
                               "num_stages": cfg.num_stages}.items() if k in names}
union, seen = [], set()
for configs in job["sets"]:
    for c in configs:
        if key(c) not in seen:
            seen.add(key(c))
            union.append(c)
allowed = {p["M"]: {key(c) for c in cs} for p, cs in zip(job["problems"], job["sets"])}
def prune(configs, named_args, **kwargs):
    keep = allowed[int(named_args["M"])]
    return [c for c in configs if key(config_dict(c)) in keep]
extra = {}
if job["interpret"]:  # no GPU driver for autotune's own benchmarker: the host clock
    from actors.timing import time_wall
    def wall(fn, quantiles=None):
        t = time_wall(fn, 1, 5)
        return [t.median_ms, t.p20_ms, t.p80_ms]
    extra["do_bench"] = wall
tuned = triton.autotune(configs=[as_config(c) for c in union], key=["M"],
                        prune_configs_by={"early_config_prune": prune}, **extra)(matmul_kernel)
device = "cpu" if job["interpret"] else "cuda"
sync = (lambda: None) if job["interpret"] else torch.cuda.synchronize
inputs = [KERNEL.make_inputs(p, device, 0) for p in job["problems"]]
sync()
ready = time.time()
print("READY " + json.dumps({"imports_inputs_s": ready - started, "union": len(union)}),
      flush=True)
for p, tensors in zip(job["problems"], inputs):
    args, _ = KERNEL.launch_args(tensors, p)
    grid = lambda META, p=p: (triton.cdiv(p["M"], META["BLOCK_M"])
                              * triton.cdiv(p["N"], META["BLOCK_N"]),)
    t0 = time.time()
    tuned[grid](*args)
    sync()
    print("SIZE " + json.dumps({"M": p["M"], "seconds": time.time() - t0,
                                "bench_s": getattr(tuned, "bench_time", None),
                                "configs": len(allowed[p["M"]]),
                                "timed": len(getattr(tuned, "configs_timings", None) or {}),
                                "best": config_dict(tuned.best_config)}), flush=True)
print("DONE " + json.dumps({"in_process_s": time.time() - ready,
                            "cache": [[list(map(str, k)), config_dict(v)]
                                      for k, v in tuned.cache.items()]}), flush=True)
"""


def autotune_command(problems: list[dict[str, Any]], sets: list[list[Config]],
                     names: list[str], tmp: Path, triton_cache: Path, interpret: bool,
                     timeout_s: float) -> dict[str, Any]:
    job = tmp / "autotune-job.json"
    job.write_text(json.dumps({"problems": problems, "sets": sets, "names": names,
                               "interpret": interpret}))
    got = run_child([sys.executable, "-c", AUTOTUNE, str(job)],
                    child_env(triton_cache, interpret=interpret), timeout_s)
    result: dict[str, Any] = {k: got[k] for k in ("rc", "timed_out", "limit_s", "command_s")}
    result["sizes"] = []
    for line in got["stdout"].splitlines():
        tag, _, body = line.partition(" ")
        if tag == "READY":
            result.update(json.loads(body))
        elif tag == "SIZE":
            result["sizes"].append(json.loads(body))
        elif tag == "DONE":
            result.update(json.loads(body))
    result["stderr"] = tail(got["stderr"])
    return result
