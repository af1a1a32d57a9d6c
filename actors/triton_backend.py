"""Compile, validate and time one config of a real Triton kernel.

The same path serves the GPU (compiled, CUDA-event timing) and the CPU (Triton's
interpreter, wall-clock timing); only compilation and the clock differ.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from actors import trace
from actors.compiles import Compiled
from actors.protocol import Retimed, Timing
from actors.timing import summarise, time_cuda, time_wall
from storage.records import Status, TrialOutcome, Validation, clip_error
from sweep_kernels import Kernel

# Where a kernel fails while running under the interpreter, the interpreter is the likely
# cause: it cannot run every kernel (a Python float has no `.to`, libdevice returns None).
UNDER_INTERPRETER = ("under Triton's CPU interpreter (which cannot run every kernel; it may "
                     "run on a GPU): ")
# A finalist this much slower than the fastest after a round of its careful re-timing
# (a median of up to 100 flushed repetitions) sits out the rounds left: a pick is held
# to 1% of the best, and the rounds are there to share drift, not to find 3%. On an H200
# the matmul's five finalists' re-timing was 2.3 s of an 11 s command; three of them
# were 6-11% slower (benchmarks/results/heavy_compiles_meta_runs/matmul_empty.tar.gz,
# its best.json). A race left with one finalist ends: the one after it, 1.3 s of a warm
# 8.5 s command, went on timing index 47 alone for two rounds (results/
# heavy_compiles_head_runs/matmul_warm.tar.gz, its best.json).
RACE_MARGIN = 1.03


def still_racing(samples: Sequence[Sequence[float]], racing: list[int]) -> list[int]:
    """The finalists whose median so far is within RACE_MARGIN of the fastest's."""
    medians = {k: statistics.median(samples[k]) for k in racing}
    fastest = min(medians.values())
    # (None is left where no median compares: a NaN, say. All race on then.)
    return [k for k in racing if medians[k] <= fastest * RACE_MARGIN] or racing


class ProcessPoisoned(Exception):
    """A sticky CUDA error: this process can launch nothing more and must be replaced."""

    def __init__(self, outcome: TrialOutcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def _error_text(e: BaseException, prefix: str = "") -> str:
    cause = e.__cause__ or e.__context__
    text = f"{prefix}{type(e).__name__}: {e}"
    if cause is not None and str(cause) not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return clip_error(text) or ""


def _mismatch(which: str, got: Any, expected: Any, rtol: float, atol: float) -> str:
    """Why an output failed validation. Outputs are filled with NaN before the launch, so
    NaN where the reference has a number is most likely a value the kernel never wrote."""
    import torch

    unwritten = torch.isnan(got) & ~torch.isnan(expected)
    left = int(unwritten.sum().item())
    if left:
        whole = "was not written" if left == got.numel() else "was not fully written"
        return (f"{which} {whole} by the kernel ({left:,} of {got.numel():,} values still "
                "NaN)")
    diff = (got - expected).abs().nan_to_num(float("inf")).max().item()
    return f"{which} differs from the reference: max abs error {diff:.4g} " \
           f"(rtol={rtol}, atol={atol})"


def _raised_by_triton_language(e: BaseException) -> bool:
    """The interpreter wraps every error of a kernel body. One whose innermost frame lies in
    triton.language (a semantic check, such as a non-power-of-2 arange) is what the compiler
    would have rejected; anything else went wrong while running."""
    import triton.language

    language_dir = str(Path(triton.language.__file__).parent)
    innermost = e
    while innermost.__cause__ is not None:
        innermost = innermost.__cause__
    frames = traceback.extract_tb(innermost.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(language_dir)


def outputs(out: Any) -> tuple[Any, ...]:
    """The tensors a kernel fills: launch_args' (or reference's) one tensor, or its tuple or
    list of them."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _is_sticky_cuda_error(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}"
    return "CUDA error" in text or "AcceleratorError" in text


def _restore(into: Any, source: Any) -> None:
    """Copy source's tensors into into's, through tuples, lists and dicts."""
    if isinstance(into, (tuple, list)):
        for a, b in zip(into, source):
            _restore(a, b)
    elif isinstance(into, dict):
        for key in into:
            _restore(into[key], source[key])
    elif hasattr(into, "copy_"):
        into.copy_(source)


def copied(value: Any) -> Any:
    """Tensors copied, through tuples, lists and dicts. A launch runs on make_inputs' draw
    copied (ProblemInputs), so a view in the draw reaches the kernel laid out densely: a
    compile for that launch takes the same copies (actors/compile_process.py)."""
    if isinstance(value, (tuple, list)):
        return type(value)(map(copied, value))
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    return value.clone() if hasattr(value, "clone") else value


class ProblemInputs:
    """A problem's inputs, drawn once per process rather than once per config (at an
    LLM's sizes the draw and the reference cost more than timing a config): the draw
    kept pristine, the copy every kernel is given, restored before each config (a kernel
    that writes its inputs, as some fused losses do, cannot hand its writes to the
    next), and the reference's outputs, computed once."""

    def __init__(self, kernel: Kernel, problem: Mapping[str, Any], device: str,
                 seed: int) -> None:
        self.kernel, self.problem = kernel, problem
        self.pristine = kernel.make_inputs(problem, device, seed)
        self.inputs = copied(self.pristine)
        self._expected: tuple[Any, ...] | None = None

    def fresh(self) -> tuple[Any, Any, dict[str, Any]]:
        """The launch's (args, out, keywords) over the inputs, restored to the draw."""
        _restore(self.inputs, self.pristine)
        return self.kernel.arguments(self.inputs, self.problem)

    def expected(self) -> tuple[Any, ...]:
        """The reference's outputs on the draw (copies: no later launch can change them)."""
        if self._expected is None:
            _restore(self.inputs, self.pristine)
            self._expected = tuple(copied(outputs(self.kernel.reference(self.inputs,
                                                                         self.problem))))
        return self._expected


class Budgets(NamedTuple):
    """(warmup_ms, rep_ms) of every config's timing, and of the finalists' re-timing."""

    trial: tuple[float, float]
    finalist: tuple[float, float]
    screen: bool = False  # each config's timing is a screen (actors/timing.py)


class TritonBackend:
    def __init__(self, kernel: Kernel, problem: Mapping[str, Any], *, interpret: bool,
                 timing: Budgets, tolerance: tuple[float, float] | None, seed: int,
                 fixed: Mapping[str, Any] | None = None,
                 problem_keys: Sequence[str] = ()) -> None:
        """fixed: keyword arguments passed on every launch besides the config's (the
        spec's; the kernel's own defaults are merged in here). problem_keys: in a sweep
        over problems, the keys each config carries besides its parameters, which set them
        in `problem` for that trial."""
        import torch

        self.kernel = kernel
        self.problem = problem
        self.problem_keys = tuple(problem_keys)
        # Under the config's keys: a parameter the spec tunes overrides a kernel default.
        self.fixed = {**kernel.fixed, **(fixed or {})}
        self.interpret = interpret
        (w, r), (fw, fr) = timing.trial, timing.finalist  # lists, when sent as JSON
        self.trial_timing, self.finalist_timing = (w, r), (fw, fr)
        self.screen = timing.screen
        self.tolerance = tuple(tolerance) if tolerance is not None else None
        self.device = "cpu" if interpret else "cuda"
        trace.note("launcher_imported")
        self.device_name = ("cpu-interpreter" if interpret
                            else torch.cuda.get_device_name(torch.cuda.current_device()))
        trace.note("launcher_device_up")
        self.seed = seed
        self._inputs: dict[str, ProblemInputs] = {}  # per problem, made once
        self._warm_up(problem)
        trace.note("launcher_warmed_up")

    def _split(self, config: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, Any]]:
        """(the trial's problem, the kernel's config) of a config as the worker got it."""
        if not self.problem_keys:
            return self.problem, dict(config)
        problem = {**self.problem, **{k: config[k] for k in self.problem_keys}}
        return problem, {k: v for k, v in config.items() if k not in self.problem_keys}

    def _inputs_for(self, problem: Mapping[str, Any]) -> ProblemInputs:
        """The problem's inputs, made once by this process."""
        key = repr(sorted(problem.items()))
        if key not in self._inputs:
            self._inputs[key] = ProblemInputs(self.kernel, problem, self.device, self.seed)
        return self._inputs[key]

    def _warm_up(self, problem: Mapping[str, Any]) -> None:
        """Pay the one-time costs now, while the compile pool starts, not in the first
        trial (on an H200 that trial took 1.3 s longer than the rest, cache warm): torch's
        first reference and comparison (cuBLAS set-up), the timer, Triton's GPU driver."""
        import torch

        try:
            expected = outputs(self.kernel.reference(self._inputs_for(problem).inputs,
                                                     problem))[0]
        except Exception:  # the problem's trials will say why; the worker stays up
            return
        torch.allclose(expected, expected)
        first = outputs(self._inputs_for(problem).fresh()[1])[0]
        self._time(lambda: first.zero_(), 1.0, 1.0)
        if not self.interpret:
            from triton.runtime import driver

            driver.active.get_current_target()

    def run_trial(self, config: Mapping[str, Any],
                  compiled: Compiled | None = None) -> TrialOutcome:
        """compiled: the compile pool's result, if it compiled this config ahead. Every
        config of a problem is validated and timed on the problem's inputs (ProblemInputs),
        drawn once from the run's seed."""

        problem, config = self._split(config)
        keywords = self._keywords(config)
        try:  # a captured kernel may no longer import
            fn, grid = self.kernel.function(problem), self.kernel.grid(problem, keywords)
        except Exception as e:
            return TrialOutcome("runtime_error", "skipped", error=_error_text(e))
        compile_ms = None
        if compiled is not None:
            if not compiled.ok:
                status: Status = "timeout" if compiled.timed_out else "compile_error"
                return TrialOutcome(status, "skipped", error=clip_error(compiled.error),
                                    compile_ms=compiled.compile_ms)
            compile_ms = compiled.compile_ms
        # Before the launch: a kernel's output may be one of its inputs.
        try:
            given = self._inputs_for(problem)
            reference = given.expected() if self.tolerance is not None else ()
        except Exception as e:
            if not self.interpret and _is_sticky_cuda_error(e):
                raise ProcessPoisoned(TrialOutcome("crashed", "skipped",
                                                   error=_error_text(e))) from None
            return TrialOutcome("runtime_error", "skipped", compile_ms=compile_ms,
                                error=_error_text(e, "the problem's inputs or reference "
                                                     "failed: "))
        args, out, passed = given.fresh()
        keywords = {**passed, **keywords}
        if compiled is None and not self.interpret:
            t0 = time.perf_counter()
            try:
                fn.warmup(*args, grid=grid, **keywords)
            except Exception as e:
                return TrialOutcome("compile_error", "skipped", error=_error_text(e))
            compile_ms = (time.perf_counter() - t0) * 1e3

        def launch() -> Any:
            return fn[grid](*args, **keywords)

        for tensor in outputs(out) if self.kernel.poisons_outputs() else ():
            tensor.fill_(float("nan"))
        try:
            first, loaded = self._launched(launch)  # time_wall's estimate (see _time)
        except Exception as e:
            return self._launch_failure(e, compile_ms)
        # The pool's binary, or another compiled now: the pool's stand-ins then missed.
        missed = compiled is not None and compiled.binary is not None and \
            getattr(loaded, "hash", compiled.binary) != compiled.binary

        validation: Validation = "disabled"
        if self.tolerance is not None:
            wrong = self._mismatched(outputs(out), reference)
            if wrong is not None:
                return replace(wrong, compile_ms=compile_ms, missed=missed)
            validation = "passed"
        try:
            t = self._time(launch, self.trial_timing[0], self.trial_timing[1], first,
                           self.screen)
        except Exception as e:
            return self._launch_failure(e, compile_ms, validation)
        return TrialOutcome("ok", validation, latency_ms=t.median_ms, latency_p20_ms=t.p20_ms,
                            latency_p80_ms=t.p80_ms, compile_ms=compile_ms, missed=missed)

    def _mismatched(self, got: tuple[Any, ...], expected: tuple[Any, ...]
                    ) -> TrialOutcome | None:
        """The outcome of outputs that are not the reference's within the tolerance."""
        import torch

        assert self.tolerance is not None
        rtol, atol = self.tolerance
        if len(expected) != len(got):
            return TrialOutcome(
                "runtime_error", "skipped",
                error=f"the kernel's reference returned {len(expected)} output(s) and "
                      f"its launch_args {len(got)}: reference must return one tensor "
                      "per output, in launch_args' order")
        for i, (tensor, reference) in enumerate(zip(got, expected)):
            a, b = tensor.float(), reference.float()
            within = atol * self.kernel.atol_scale(b)
            if not torch.allclose(a, b, rtol=rtol, atol=within):
                which = "output" if len(got) == 1 else f"output {i + 1} of {len(got)}"
                return TrialOutcome("incorrect", "failed",
                                    error=_mismatch(which, a, b, rtol, within))
        return None

    def _launched(self, launch: Callable[[], Any]) -> tuple[float, Any]:
        """Launch once, to its end: how long that took, and what the launch returned
        (Triton's compiled kernel)."""
        start = time.perf_counter()
        loaded = launch()
        if not self.interpret:
            import torch

            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3, loaded

    def _time(self, launch: Callable[[], None], warmup_ms: float, rep_ms: float,
              first_ms: float | None = None, screen: bool = False) -> Timing:
        """first_ms: how long the config's first (validating) launch took; under the
        interpreter (each launch tens of ms or more, a timing that says nothing of a GPU's)
        it is time_wall's estimate and, with no warm-up due, its first sample: a launch
        fewer of four per config. screen: it ends once its median is known (on a GPU)."""
        if self.interpret:
            return time_wall(launch, warmup_ms, rep_ms, first_ms=first_ms)
        return time_cuda(launch, warmup_ms, rep_ms, screen)

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> Retimed:
        """Time the finalists interleaved (A B C A B C ...) on the same inputs, so clock
        drift and heat fall on all of them alike; each gets the median over rounds. The
        kernel's torch baseline (its reference where it has none) takes its turn in the
        same rotation, on the same inputs: what the winner is compared with. One that
        fails is left out (the finalists' timings stand). In a sweep over problems the
        finalists are of one problem, whose fixed inputs they share."""
        split = [self._split(c) for c in configs]
        problem = split[0][0] if split else self.problem
        if any(p != problem for p, _ in split):
            raise ValueError("finalists of more than one problem re-timed together")
        given = self._inputs_for(problem)
        args, _, passed = given.fresh()
        inputs = given.inputs
        launches = [self._launcher(c, problem, args, passed) for _, c in split]
        samples: list[list[float]] = [[] for _ in configs]
        torch_fn = self.kernel.baseline or self.kernel.reference

        baseline: list[float] | None = []

        def run_baseline() -> None:
            torch_fn(inputs, problem)

        def try_baseline(timed: bool) -> None:
            nonlocal baseline
            if baseline is None:
                return
            try:
                if timed:
                    baseline.append(self._time(run_baseline, *self.finalist_timing).median_ms)
                else:
                    run_baseline()
            except Exception as e:
                if not self.interpret and _is_sticky_cuda_error(e):
                    raise
                baseline = None

        try_baseline(timed=False)  # one-time costs (a library's set-up) are not its speed
        racing = list(range(len(configs)))
        for left in reversed(range(rounds)):
            for k in racing:
                samples[k].append(self._time(launches[k], *self.finalist_timing).median_ms)
            try_baseline(timed=True)
            if left:
                racing = still_racing(samples, racing)
                if len(racing) == 1:  # a race of one is over: it can only win
                    break
        return Retimed([summarise(s) for s in samples],
                       summarise(baseline) if baseline else None,
                       "baseline" if self.kernel.baseline else "reference",
                       [len(s) for s in samples])

    def _keywords(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """What the kernel and its grid get: the fixed values and the config."""
        return {**self.fixed, **config}

    def _launcher(self, config: Mapping[str, Any], problem: Mapping[str, Any],
                  args: Sequence[Any], passed: Mapping[str, Any]) -> Callable[[], None]:
        keywords = self._keywords(config)
        fn, grid = self.kernel.function(problem), self.kernel.grid(problem, keywords)
        keywords = {**passed, **keywords}
        return lambda: fn[grid](*args, **keywords)

    def _launch_failure(self, e: Exception, compile_ms: float | None,
                        validation: str = "skipped") -> TrialOutcome:
        from triton.runtime.errors import OutOfResources

        text = _error_text(e)
        if isinstance(e, OutOfResources) or (self.interpret and _raised_by_triton_language(e)):
            # Resource limits and language rules belong to the config, as compile errors do.
            return TrialOutcome("compile_error", "skipped", error=text, compile_ms=compile_ms)
        if not self.interpret and _is_sticky_cuda_error(e):
            raise ProcessPoisoned(TrialOutcome("crashed", "skipped", error=text,
                                               compile_ms=compile_ms))
        if self.interpret:
            text = _error_text(e, UNDER_INTERPRETER)
        return TrialOutcome("runtime_error", validation, error=text,  # type: ignore[arg-type]
                            compile_ms=compile_ms)
