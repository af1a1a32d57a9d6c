"""Compiling for a GPU without setting it up.

Triton compiles for a target (an architecture and a warp size), not for a device, but its
JIT asks the active driver for the current device, stream and target, and torch's driver
answers those by setting up CUDA. Fifteen compile processes setting up CUDA at once on one
H200 came up 2.5-3 s after their worker (at 6.5-7.3 s of a 14 s sweep: benchmarks/results/
heavy_compiles_final_runs/, each run's trace.jsonl), and each held GPU memory of its own.

So a compile process asks NVML (the driver's management library, which a fork leaves
usable, unlike CUDA) for the target, puts a driver in front of Triton's that answers from
it, and passes stand-ins for the launch arguments: the kernel's own make_inputs run on
torch's meta device (actors/meta_inputs.py; else under FakeTensorMode, which imports much
of torch's compiler stack first: seconds), with no memory and no values drawn, each
tensor then a StandIn with the meta tensor's dtype, shape and strides and a pointer
aligned as a real one would be (torch aligns a storage; a view's offset may not be),
every other argument as made. Once, real tensors of the same geometry must reach the
same binary (real_twins). Where any of this is not possible (no NVML, GPUs of different
kinds, a make_inputs neither can run, a check that fails) the process sets up CUDA as
before.
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
        return _nvml_target()
    except Exception:  # an NVML without a symbol, a call that fails: CUDA as before
        return None


def _nvml_target() -> tuple[int, int] | None:
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


class StandIn:
    """A tensor as Triton's JIT sees it, with no memory: the meta tensor's dtype, shape and
    strides (a heuristic may read them), and a pointer whose 16-byte alignment is a real
    allocation's (torch aligns a tensor's storage, so a view's is its offset's)."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor
        self.dtype = tensor.dtype

    def data_ptr(self) -> int:
        return int(self._tensor.storage_offset()) * int(self._tensor.element_size())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor, name)


def stand_ins(kernel: Any, problem: dict[str, Any],
              seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional, keyword) launch arguments of the problem as a compile needs them:
    tensors as StandIns, the rest as the kernel makes them. make_inputs runs on the meta
    device (actors/meta_inputs.py: milliseconds), else under FakeTensorMode (seconds)."""
    import torch

    from actors.meta_inputs import on_meta
    from actors.triton_backend import copied

    try:
        with on_meta():
            inputs = copied(kernel.make_inputs(problem, "cpu", seed))  # as launched
            args, _, passed = kernel.arguments(inputs, problem)
    except Exception:  # an op the meta device has no answer for: fake tensors, then
        from torch._subclasses.fake_tensor import FakeTensorMode

        # Real tensors may come in (a capture's saved integer inputs): they stay real.
        with FakeTensorMode(allow_non_fake_inputs=True):
            inputs = copied(kernel.make_inputs(problem, "cpu", seed))
            args, _, passed = kernel.arguments(inputs, problem)

    def stand_in(value: Any) -> Any:
        return StandIn(value) if isinstance(value, torch.Tensor) else value

    return tuple(stand_in(a) for a in args), {k: stand_in(v) for k, v in passed.items()}


def real_twins(args: tuple[tuple[Any, ...], dict[str, Any]]
               ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The stand-ins' arguments with real tensors of their dtypes, shapes, strides and
    offsets (on the CPU, allocated but never written): what the once-per-process check
    compiles, since Triton specialises a pointer on its dtype and alignment, not its
    device, and finds the stand-ins' binary in its in-memory cache where they agree."""
    import torch

    def real(value: Any) -> Any:
        if not isinstance(value, StandIn):
            return value
        t = value._tensor
        size = t.storage_offset() + sum(max(n - 1, 0) * st for n, st in zip(t.shape, t.stride()))
        storage = torch.empty(int(size) + 1, dtype=t.dtype)
        return storage.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())

    positional, passed = args
    return tuple(real(a) for a in positional), {k: real(v) for k, v in passed.items()}


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
