"""(d) of benchmarks/shapes.py: the re-timing, in a process of its own (shapes.py
--retime-child JOB, started from the repository root): each size on one set of inputs,
every config of its space screened once, then the candidates (each approach's pick, the
screen's top, the trial tables' tops) timed side by side in interleaved rounds, by
do_bench and by the project's timer (a CUDA graph's replay below 20 us).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.shapes_command import Config, child_env, key_of, run_child, tail

# The child runs as `python3 benchmarks/shapes.py --retime-child JOB` (whose entry calls
# retime_child), from the repository root as the parent is run.
ENTRY = Path(__file__).resolve().parent / "shapes.py"


Launch = Callable[[], object]


def timers(job: dict[str, Any]) -> tuple[Callable[[Launch], float],
                                         Callable[[Launch], tuple[float, float | None]],
                                         Callable[[], None]]:
    """(d)'s clocks: the screen's, the side by side one's (do_bench's median and, below 20
    us, a CUDA graph's replay as the project times it) and the sync between; under the
    interpreter the host clock, and no graph."""
    if job["interpret"]:
        from actors.timing import time_wall

        def screen(fn: Launch) -> float:
            return time_wall(fn, 1, 3).median_ms

        def careful(fn: Launch) -> tuple[float, float | None]:
            return time_wall(fn, 1, 5).median_ms, None
        return screen, careful, lambda: None
    import torch
    import triton.testing

    from actors.timing import GRAPH_BELOW_MS
    sw, sr = job["screen_ms"]
    cw, cr = job["careful_ms"]

    def screen_gpu(fn: Launch) -> float:
        return float(triton.testing.do_bench(fn, warmup=sw, rep=sr,
                                             quantiles=[0.5, 0.2, 0.8])[0])

    def careful_gpu(fn: Launch) -> tuple[float, float | None]:
        median = float(triton.testing.do_bench(fn, warmup=cw, rep=cr,
                                               quantiles=[0.5, 0.2, 0.8])[0])
        graph = None
        if median < GRAPH_BELOW_MS:  # as actors/timing.py's time_cuda times it
            graph = float(triton.testing.do_bench_cudagraph(
                fn, rep=cr, quantiles=[0.5, 0.2, 0.8])[0])
        return median, graph
    return screen_gpu, careful_gpu, torch.cuda.synchronize


def retime_child(job_path: Path) -> None:
    """(d)'s process: each size on one set of inputs; every config screened once, then the
    candidates re-timed side by side. Writes job['result'] after each size."""
    job = json.loads(job_path.read_text())
    interpret = job["interpret"]
    import torch

    from sweep_kernels.matmul import KERNEL

    device = "cpu" if interpret else "cuda"
    clocks = timers(job)
    out: dict[str, Any] = {"device": (torch.cuda.get_device_name(0) if not interpret
                                      else "cpu-interpreter"), "sizes": []}
    result_path = Path(job["result"])
    for size in job["sizes"]:
        t_size = time.time()
        entry = retime_size(KERNEL, size, job, device, *clocks)
        entry["seconds"] = time.time() - t_size
        out["sizes"].append(entry)
        result_path.write_text(json.dumps(out))
        print(f"retimed M={size['problem'].get('M')}: {len(entry['retimed'])} candidates in "
              f"{time.time() - t_size:.1f} s", flush=True)


def retime_size(kernel: Any, size: dict[str, Any], job: dict[str, Any], device: str,
                screen: Callable[[Launch], float],
                careful: Callable[[Launch], tuple[float, float | None]],
                sync: Callable[[], None]) -> dict[str, Any]:
    """One size: its space screened, then its candidates (the screen's top and the job's
    extra configs, each with its labels) timed in interleaved rounds."""
    problem = size["problem"]
    fn = kernel.fn
    inputs = kernel.make_inputs(problem, device, 0)
    args, _ = kernel.launch_args(inputs, problem)

    def launcher(config: Config) -> Callable[[], None]:
        grid = kernel.grid(problem, config)
        return lambda: fn[grid](*args, **config)

    screened: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    for config in size["space"]:
        launch = launcher(config)
        try:
            launch()
            sync()
            screened[key_of(config)] = screen(launch)
        except Exception as e:  # a config that cannot run here has no latency
            screened[key_of(config)] = None
            errors[key_of(config)] = f"{type(e).__name__}: {e}"[:200]
    ranked = sorted((k for k, v in screened.items() if v is not None),
                    key=lambda k: screened[k] or 0.0)
    labels: dict[str, list[str]] = {}
    for k in ranked[:job["top"]]:
        labels.setdefault(k, []).append("screen_top")
    for label, config in size["extra"]:
        labels.setdefault(key_of(config), []).append(label)
    candidates = [k for k in labels if k not in errors]
    launches = [launcher(json.loads(k)) for k in candidates]
    for launch in launches:  # loaded and warm before the first round
        launch()
    sync()
    samples: list[list[float]] = [[] for _ in candidates]
    graphs: list[list[float]] = [[] for _ in candidates]
    for _ in range(job["rounds"]):
        for launch, got, graph in zip(launches, samples, graphs):
            median, replay = careful(launch)
            got.append(median)
            # The project's timer: the graph's replay where do_bench says < 20 us.
            graph.append(replay if replay is not None else median)
    retimed = [{"config": json.loads(k), "labels": labels[k], "samples_ms": s,
                "median_ms": statistics.median(s), "project_samples_ms": g,
                "project_median_ms": statistics.median(g)}
               for k, s, g in zip(candidates, samples, graphs)]
    return {"problem": problem, "configs": len(size["space"]),
            "screened": [[json.loads(k), v] for k, v in screened.items()],
            "errors": errors, "retimed": retimed}


def retime_command(problems: list[dict[str, Any]], sets: list[list[Config]],
                   extras: list[list[tuple[str, Config]]], tmp: Path, triton_cache: Path,
                   interpret: bool, args: argparse.Namespace,
                   timeout_s: float) -> dict[str, Any]:
    job = tmp / "retime-job.json"
    result_path = tmp / "retime-result.json"
    job.write_text(json.dumps({
        "interpret": interpret, "result": str(result_path), "top": args.top,
        "rounds": args.rounds, "screen_ms": [5, 20], "careful_ms": [args.warmup_ms, args.rep_ms],
        "sizes": [{"problem": p, "space": s, "extra": e}
                  for p, s, e in zip(problems, sets, extras)]}))
    got = run_child([sys.executable, str(ENTRY), "--retime-child", str(job)],
                    child_env(triton_cache, interpret=interpret), timeout_s)
    result: dict[str, Any] = {k: got[k] for k in ("rc", "timed_out", "limit_s", "command_s")}
    result["timer"] = ("time_wall (host clock)" if interpret else
                       f"do_bench screen 5/20 ms; side by side {args.warmup_ms}/{args.rep_ms} ms "
                       f"x {args.rounds} rounds; project: do_bench_cudagraph below 20 us")
    result["stdout"] = tail(got["stdout"])
    result["stderr"] = tail(got["stderr"])
    if result_path.exists():
        result.update(json.loads(result_path.read_text()))
    return result
