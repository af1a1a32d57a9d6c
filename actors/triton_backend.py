"""Compile, validate and time one config of a real Triton kernel.

The same path serves the GPU (compiled, CUDA-event timing) and the CPU (Triton's
interpreter, wall-clock timing); only compilation and the clock differ.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors.timing import time_cuda, time_wall
from kernels import Kernel
from storage.records import TrialOutcome, clip_error


class ProcessPoisoned(Exception):
    """A sticky CUDA error: this process can launch nothing more and must be replaced."""

    def __init__(self, outcome: TrialOutcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def _error_text(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    text = f"{type(e).__name__}: {e}"
    if cause is not None and str(cause) not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return clip_error(text) or ""


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


def _is_sticky_cuda_error(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}"
    return "CUDA error" in text or "AcceleratorError" in text


class TritonBackend:
    def __init__(self, kernel: Kernel, problem: Mapping[str, Any], *, interpret: bool,
                 warmup_ms: float, rep_ms: float, tolerance: tuple[float, float] | None,
                 seed: int) -> None:
        import torch

        self.kernel = kernel
        self.problem = problem
        self.interpret = interpret
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.tolerance = tolerance
        self.device = "cpu" if interpret else "cuda"
        self.device_name = ("cpu-interpreter" if interpret
                            else torch.cuda.get_device_name(torch.cuda.current_device()))
        self.inputs = kernel.make_inputs(problem, self.device, seed)
        self.expected = kernel.reference(self.inputs, problem) if tolerance else None
        self.args, self.out = kernel.launch_args(self.inputs, problem)

    def run_trial(self, config: Mapping[str, Any]) -> TrialOutcome:
        import torch

        fn = self.kernel.fn
        grid = self.kernel.grid(self.problem, config)
        compile_ms = None
        if not self.interpret:
            t0 = time.perf_counter()
            try:
                fn.warmup(*self.args, grid=grid, **config)
            except Exception as e:
                return TrialOutcome("compile_error", "skipped", error=_error_text(e))
            compile_ms = (time.perf_counter() - t0) * 1e3

        def launch() -> None:
            fn[grid](*self.args, **config)

        # NaN first, so output the kernel never wrote cannot pass as correct.
        self.out.fill_(float("nan"))
        try:
            launch()
            if not self.interpret:
                torch.cuda.synchronize()
        except Exception as e:
            return self._launch_failure(e, compile_ms)

        validation = "disabled"
        if self.tolerance is not None:
            rtol, atol = self.tolerance
            got = self.out.float()
            if not torch.allclose(got, self.expected, rtol=rtol, atol=atol):
                diff = (got - self.expected).abs().nan_to_num(float("inf")).max().item()
                return TrialOutcome("incorrect", "failed", compile_ms=compile_ms,
                                    error=f"output differs from the reference: max abs error "
                                          f"{diff:.4g} (rtol={rtol}, atol={atol})")
            validation = "passed"
        try:
            bench = time_wall if self.interpret else time_cuda
            t = bench(launch, self.warmup_ms, self.rep_ms)
        except Exception as e:
            return self._launch_failure(e, compile_ms, validation)
        return TrialOutcome("ok", validation, latency_ms=t.median_ms, latency_p20_ms=t.p20_ms,
                            latency_p80_ms=t.p80_ms, compile_ms=compile_ms)

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
        return TrialOutcome("runtime_error", validation, error=text,  # type: ignore[arg-type]
                            compile_ms=compile_ms)
