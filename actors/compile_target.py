"""Compiling for a GPU without setting it up.

Triton compiles for a target (an architecture and a warp size), not for a device, but its
JIT asks the active driver for the current device, stream and target, and torch's driver
answers those by setting up CUDA. Fifteen compile processes setting up CUDA at once on one
H200 came up 2.5-3 s after their worker (at 6.5-7.3 s of a 14 s sweep: benchmarks/results/
heavy_compiles_final_runs/, each run's trace.jsonl), and each held GPU memory of its own.

So a compile process asks NVML (the driver's management library, which a fork leaves
usable, unlike CUDA) for the target, puts a driver in front of Triton's that answers from
it, and passes stand-ins for the launch arguments: the kernel's own make_inputs run on
the CPU under torch's FakeTensorMode (no memory, no random numbers drawn), each tensor then
Triton's MockTensor of its dtype, every other argument as made. Triton specialises a
pointer on its 16-byte alignment, which a stand-in has as torch's allocations do; a launch
on a view that has not compiles a binary of its own in the worker, as without a pool.
Where any of this is not possible (no NVML, GPUs of different kinds, a make_inputs that
fake tensors cannot run) the process sets up CUDA as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable
from typing import Any

WARP_SIZE = 32  # every NVIDIA GPU's


@functools.cache
def gpu_target() -> tuple[int, int] | None:
    """(architecture, warp size) of this machine's GPUs, e.g. (90, 32) on an H200, where
    NVML answers and every GPU is of one kind (which of them a process sees does not
    matter then); None otherwise. Asks NVML only: no CUDA, so forking stays safe."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return None
        kinds = set()
        for i in range(count.value):
            handle = ctypes.c_void_p()
            major, minor = ctypes.c_int(), ctypes.c_int()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0 or \
                    nvml.nvmlDeviceGetCudaComputeCapability(
                        handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
                return None
            kinds.add(major.value * 10 + minor.value)
        return (kinds.pop(), WARP_SIZE) if len(kinds) == 1 else None
    finally:
        nvml.nvmlShutdown()


class TargetDriver:
    """Stands in front of Triton's driver: the current device and stream are 0 and the
    target the one given, so a compile never sets up CUDA; anything else is the real
    driver's, made when first asked for (it imports, but does not set up, CUDA)."""

    def __init__(self, arch: int, warp_size: int, real: Callable[[], Any]) -> None:
        from triton.backends.compiler import GPUTarget

        self._target = GPUTarget("cuda", arch, warp_size)
        self._real = real

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self._target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)


def activate(target: tuple[int, int]) -> bool:
    """Put a TargetDriver for target in front of Triton's driver; False where this
    Triton has no place for one."""
    from triton.runtime import driver

    if not callable(getattr(driver, "set_active", None)):
        return False
    driver.set_active(TargetDriver(*target, real=lambda: driver.default))
    return True


def deactivate() -> None:
    """Triton's own driver again, made when next asked for (reset_active would make it
    now, which raises where no GPU driver is)."""
    from triton.runtime import driver

    if hasattr(driver, "_active"):
        driver._active = None
    else:
        driver.reset_active()


def stand_ins(kernel: Any, problem: dict[str, Any],
              seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional, keyword) launch arguments of the problem as a compile needs them:
    tensors as MockTensors of their dtypes, the rest as the kernel makes them."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from triton.runtime.jit import MockTensor

    with FakeTensorMode():
        inputs = kernel.make_inputs(problem, "cpu", seed)
        args, _, passed = kernel.arguments(inputs, problem)

    def mock(value: Any) -> Any:
        return MockTensor(value.dtype) if isinstance(value, torch.Tensor) else value

    return tuple(mock(a) for a in args), {k: mock(v) for k, v in passed.items()}


def same_binary(function: Any, grid: Any, args: tuple[tuple[Any, ...], dict[str, Any]],
                keywords: dict[str, Any], compiled: Any) -> bool:
    """Whether real tensors (tiny ones on the CPU, of the stand-ins' dtypes: Triton
    specialises a pointer on its dtype and alignment, not its device) reach the binary the
    stand-ins compiled, as Triton's in-memory cache answers: one lookup, no compile, when
    they do."""
    import torch
    from triton.runtime.jit import MockTensor

    def real(value: Any) -> Any:
        return torch.empty(1, dtype=value.dtype) if isinstance(value, MockTensor) else value

    positional, passed = args
    again = function.warmup(*(real(a) for a in positional), grid=grid,
                            **{k: real(v) for k, v in passed.items()}, **keywords)
    return again is compiled


def the_configs(error: Exception) -> bool:
    """Whether a compile's error is Triton's about the kernel at this config (its
    source, its resources), which real arguments would meet too."""
    from triton.compiler.errors import CompilationError

    kinds: list[type] = [CompilationError]
    with contextlib.suppress(ImportError):
        from triton.errors import TritonError

        kinds.append(TritonError)
    return isinstance(error, tuple(kinds))


def build_launcher(compiled: Any) -> None:
    """Build Triton's launcher for the compiled kernel's signature, which it caches on
    disk (some versions compile a C stub per signature), so the worker's first launch
    finds it; a failure here is the worker's to meet, not the compile's."""
    from triton.runtime import driver

    with contextlib.suppress(Exception):
        driver.active.launcher_cls(compiled.src, compiled.metadata)
