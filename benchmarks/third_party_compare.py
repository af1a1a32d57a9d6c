"""The pick against the package's own launches, for benchmarks/third_party.py (run in a
process of its own, `third_party.py --compare NAME`): on one set of inputs, each pick (a
best.json) and each of the package's launches validated against the kernel's reference,
then timed interleaved, and the pick's speedup over each.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.third_party_cases import HERE, Case

# A launch, the config it reports, and the outputs it fills (cleared before validating).
Candidate = tuple[Callable[[], None], dict[str, Any], Callable[[], tuple[Any, ...]]]


@dataclass
class Setup:
    """The kernel's module and record, and the run's problem, fixed values and tolerance."""
    module: Any
    kernel: Any
    problem: dict[str, Any]
    fixed: dict[str, Any]
    rtol: float
    atol: float


def compare(case: Case, run_dir: Path, picks: dict[str, Path], rounds: int,
            smoke: bool) -> dict[str, Any]:
    """Validate, then time interleaved: each pick (a best.json) and the package's own
    launches, on one set of inputs, in this process."""
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(HERE))
    import torch

    from actors.triton_backend import outputs

    setup = _setup(case, run_dir, smoke)
    inputs = setup.kernel.make_inputs(setup.problem, "cpu" if smoke else "cuda", 0)
    expected = outputs(setup.kernel.reference(inputs, setup.problem))
    candidates = _candidates(setup, inputs, picks)
    sync = torch.cuda.synchronize if not smoke else (lambda: None)
    checked = {name: _validate(name, candidate, expected, setup, sync)
               for name, candidate in candidates.items()}
    timed = [n for n in candidates if checked[n]["valid"]]
    medians = _time(candidates, timed, rounds, _bench(smoke), checked, setup)
    speedups = {p: {n: medians[n] / medians[p] for n in timed if n not in picks}
                for p in picks if p in medians}
    return {"problem": setup.problem, "fixed": setup.fixed,
            "tolerance": [setup.rtol, setup.atol], "rounds": rounds,
            "timing": "wall clock (interpreter)" if smoke else
            "triton.testing.do_bench(warmup=25, rep=100), median; median over rounds",
            "device": "cpu-interpreter" if smoke else torch.cuda.get_device_name(0),
            "torch": torch.__version__, "candidates": checked, "speedup_of_pick": speedups,
            "own": case.own}


def _setup(case: Case, run_dir: Path, smoke: bool) -> Setup:
    """The kernel's module (made runnable under the interpreter for --smoke) and the
    problem the run swept, from its own spec.yaml."""
    from sweep.spec import load_spec

    if smoke:
        from check_cpu import interpretable_liger  # the interpreter's stand-ins, see there

        interpretable_liger()
    module = importlib.import_module(case.name)
    spec = load_spec(run_dir / "spec.yaml")
    problem, fixed = dict(spec.problem), dict(spec.fixed)
    tol = spec.validation
    rtol, atol = (tol.rtol, tol.atol) if tol else (0.01, 0.01)
    if hasattr(module, "check_fixed") and module.check_fixed(problem, fixed):
        raise SystemExit(f"spec and problem disagree: {module.check_fixed(problem, fixed)}")
    if smoke and case.name == "fla_chunk_o":
        # fla's autotuner benchmarks its configs, which needs a GPU: held to one here.
        module.DECORATED.fn.configs = module.DECORATED.fn.configs[-1:]
    return Setup(module, module.KERNEL, problem, fixed, rtol, atol)


def _candidates(setup: Setup, inputs: Any, picks: dict[str, Path]) -> dict[str, Candidate]:
    """The picks with a config, then the package's own launches, then torch's baseline."""
    from actors.triton_backend import outputs

    kernel, problem = setup.kernel, setup.problem
    candidates: dict[str, Candidate] = {}
    for name, path in picks.items():
        best = json.loads(path.read_text())
        if best.get("config") is None:
            continue
        config = dict(best["config"])
        args, out = kernel.launch_args(inputs, problem)
        keywords = {**setup.fixed, **config}
        grid = kernel.grid(problem, keywords)

        # Defaults bind this pick's values: the closures outlive the loop.
        def launch(args: Any = args, keywords: dict = keywords, grid: Any = grid) -> None:
            kernel.fn[grid](*args, **keywords)

        def filled(out: Any = out) -> tuple[Any, ...]:
            return outputs(out)

        candidates[name] = (launch, {"index": best.get("index"), **config}, filled)
    candidates.update(setup.module.package_launches(inputs, problem))
    if kernel.baseline is not None:
        held: list[Any] = []

        def torch_own() -> None:
            held[:] = [kernel.baseline(inputs, problem)]

        candidates["torch"] = (torch_own, {"of": "the kernel's baseline"}, lambda: tuple(held))
    return candidates


def _validate(name: str, candidate: Candidate, expected: tuple[Any, ...], setup: Setup,
              sync: Callable[[], None]) -> dict[str, Any]:
    """One launch on outputs set to NaN first, against the reference's; printed."""
    import torch

    launch, config, filled = candidate
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
            torch.allclose(a.float(), b.float(), rtol=setup.rtol, atol=setup.atol)
            for a, b in zip(got, want))
    except Exception as e:
        entry["valid"] = False
        entry["error"] = f"{type(e).__name__}: {str(e)[:500]}"
    print(f"{name}: valid={entry['valid']} {config} {entry.get('max_abs_error')}"
          f" {entry.get('error', '')}", flush=True)
    return entry


def _bench(smoke: bool) -> Callable[[Callable[[], None]], float]:
    """One timing of a launch, in ms: do_bench's median, or the wall clock under the
    interpreter (no GPU events there)."""
    if smoke:
        from actors.timing import time_wall

        def bench(fn: Callable[[], None]) -> float:
            return time_wall(fn, 1.0, 5.0, max_reps=3).median_ms
    else:
        import triton.testing

        def bench(fn: Callable[[], None]) -> float:
            return float(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                 return_mode="median"))
    return bench


def _time(candidates: dict[str, Candidate], timed: list[str], rounds: int,
          bench: Callable[[Callable[[], None]], float], checked: dict[str, dict[str, Any]],
          setup: Setup) -> dict[str, float]:
    """Rounds of the valid candidates interleaved, into checked with their throughput;
    each one's median."""
    samples: dict[str, list[float]] = {n: [] for n in timed}
    for _ in range(rounds):
        for n in timed:  # A B C A B C ...: drift and heat fall on all alike
            samples[n].append(bench(candidates[n][0]))
    medians = {n: statistics.median(v) for n, v in samples.items()}
    kernel, problem = setup.kernel, setup.problem
    for n in timed:
        checked[n].update(rounds_ms=samples[n], median_ms=medians[n])
        if kernel.bytes_moved:
            checked[n]["gb_per_s"] = kernel.bytes_moved(problem) / medians[n] / 1e6
        if kernel.flops:
            checked[n]["tflop_per_s"] = kernel.flops(problem) / medians[n] / 1e9
    return medians
