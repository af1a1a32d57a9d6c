"""A capture as a kernel a sweep tunes: every (autotuned kernel, key) a program called is a
problem ({"kernel": "module:attr", "key": label}), launched on the call's own arguments.

The inputs are the call's: integer and boolean tensors as saved, floating-point ones re-made
from the run's seed with the saved geometry (zeros where the kernel resets them), scalars as
values. Each config launches as Triton's autotuner benchmarks it: the config's pre_hook, the
autotuner's pre_hook (reset_to_zero, restore_value), the launch, its post_hook. There is no
torch reference: a config is validated against the kernel's first config on the same inputs,
over the tensors the capture saw one launch change.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.capture import Arg, Call, Capture, config_form, read_blob, read_capture
from sweep_kernels.record import CAPTURE, Kernel, Problem


def _torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in the capture")
    return dtype


def _tensor(directory: Path, arg: Arg, device: str, seed: int) -> Any:
    import torch

    t = arg.tensor
    assert t is not None
    dtype = _torch_dtype(t.dtype)
    if t.blob:
        size = t.storage * torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(bytearray(read_blob(directory, t.blob, size)), dtype=dtype)
        flat = flat.to(device)
    elif t.zero or not (dtype.is_floating_point or dtype.is_complex):
        flat = torch.zeros(t.storage, dtype=dtype, device=device)
    else:
        generator = torch.Generator(device=device).manual_seed(seed)
        flat = torch.randn(t.storage, dtype=dtype, device=device, generator=generator)
    return flat.as_strided(t.shape, t.strides)


@dataclass(frozen=True)
class CapturedKernel(Kernel):
    """The Kernel record of a capture (load_kernel("capture:/path/capture.json"))."""

    capture: Capture = field(default_factory=lambda: Capture((), ()))
    directory: Path = Path(".")

    def call(self, problem: Problem) -> Call:
        found = self.capture.call(problem.get("kernel", ""), problem.get("key", ""))
        if found is None:
            raise KeyError(f"the capture holds no call of {problem.get('kernel')!r} with key "
                           f"{problem.get('key')!r}")
        return found

    def problem_error(self, problem: Problem) -> str | None:
        """Why a spec's problem is not one of the capture's calls (None: it is)."""
        try:
            self.call(problem)
        except KeyError as e:
            return str(e.args[0])
        return None

    def tuner(self, problem: Problem) -> Any:
        """The live Autotuner the call went into, imported as the program imported it."""
        module_name, _, attr = self.call(problem).kernel.partition(":")
        root = self.call(problem).root
        if root and root not in sys.path:
            sys.path.append(root)
        found = getattr(importlib.import_module(module_name), attr)
        while not hasattr(found, "configs") and hasattr(found, "fn"):  # an outer heuristics
            found = found.fn
        return found

    def function(self, problem: Problem) -> Any:
        return _Launcher(self.tuner(problem))

    def arguments(self, inputs: tuple[Any, ...],
                  problem: Problem) -> tuple[tuple[Any, ...], Any, dict[str, Any]]:
        call = self.call(problem)
        given = dict(zip((a.name for a in call.args), inputs))
        return (), tuple(given[name] for name in call.outputs), given

    def poisons_outputs(self) -> bool:
        """No: a captured kernel's outputs may be its inputs too (written in place). The
        reference is another config's launch on the same restored inputs, so an output a
        config leaves unwritten still holds the draw where the reference has a result."""
        return False

    def atol_scale(self, expected: Any) -> float:
        """The output's largest magnitude (at least 1): the reference is another config's
        launch on made-up inputs, and a config that sums in another order (atomics, split
        reductions) differs from it by rounding at that magnitude, not at each value's."""
        import torch

        finite = expected[torch.isfinite(expected)]
        return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


_DEFAULTS = {"num_ctas": 1, "maxnreg": None}  # Triton's, for a config that leaves them out


class _Launcher:
    """An autotuned kernel launched with one given config, as Triton's benchmark does.

    Every launch finds its config in one dict lookup: this runs inside the timed region of a
    short kernel, where a cost that grew with the config's place in the list once made the
    list's first configs look the fastest."""

    def __init__(self, tuner: Any) -> None:
        self.tuner = tuner
        self.names = tuple(sorted({k for c in tuner.configs for k in _values(c)}))
        self.configs = {self._key(_values(c)): c for c in tuner.configs}

    def _key(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(values.get(n, _DEFAULTS.get(n)) for n in self.names)

    def _config(self, kwargs: Mapping[str, Any]) -> Any:
        return self.configs.get(self._key(kwargs))

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            # The pre hooks (the config's, reset_to_zero's zeroing) run as in Triton's
            # benchmark; the post hook (restore_value's copy back) does not: the sweep
            # restores every input before each config itself, and a copy back would undo
            # what a kernel that writes its inputs is validated on.
            config = self._config(kwargs)
            full = {**dict(zip(self.tuner.arg_names, args)), **kwargs}
            if config is not None and config.pre_hook is not None:
                config.pre_hook(full)
            self.tuner.pre_hook(full)
            return self.tuner.fn[grid](*args, **kwargs)

        return launch

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        return self.tuner.fn.warmup(*args, grid=grid, **kwargs)


def _values(config: Any) -> dict[str, Any]:
    return {k: v for k, v in config.all_kwargs().items() if k != "ir_override"}


def program(path: str) -> CapturedKernel:
    """The kernel of the capture at path (capture.json, or the folder holding it)."""
    where = Path(path)
    capture = read_capture(where)
    directory = where if where.is_dir() else where.parent

    def make_inputs(problem: Problem, device: str, seed: int) -> tuple[Any, ...]:
        call = kernel.call(problem)
        return tuple(_tensor(directory, a, device, seed * 1000 + i) if a.tensor is not None
                     else a.value for i, a in enumerate(call.args))

    def reference(inputs: tuple[Any, ...], problem: Problem) -> tuple[Any, ...]:
        """The outputs of the kernel's first config that launches (one may not fit the
        device at this call's sizes, as Triton's own tuning would find)."""
        _, out, given = kernel.arguments(inputs, problem)
        launcher = kernel.function(problem)
        failure: Exception | None = None
        for config in kernel.call(problem).configs:
            try:
                launcher[config.grid](**given, **config.as_spec())
            except Exception as e:  # the next config's turn; the first failure is said
                failure = failure or e
                continue
            return tuple(t.clone() for t in out)
        assert failure is not None
        raise failure

    def grid(problem: Problem, config: Mapping[str, Any]) -> tuple[int, ...]:
        call = kernel.call(problem)
        grids = {config_form(c.as_spec()): c.grid for c in call.configs}
        names = {k for c in call.configs for k in c.as_spec()}
        found = grids.get(config_form({k: v for k, v in config.items() if k in names}))
        if found is not None:
            return found
        if len(set(grids.values())) == 1:  # one grid for every config: this one's too
            return next(iter(grids.values()))
        raise ValueError("a config the capture did not see: its grid is not known")

    first = capture.calls[0] if capture.calls else None
    kernel = CapturedKernel(
        name=f"{CAPTURE}{where}", fn=None,
        problem_defaults={"kernel": first.kernel if first else "",
                          "key": first.label if first else ""},
        make_inputs=make_inputs, reference=reference,
        launch_args=lambda inputs, problem: kernel.arguments(inputs, problem)[:2],
        grid=grid, capture=capture, directory=directory)
    return kernel


def source_files(kernel: Kernel) -> dict[str, str]:
    """A capture's files: capture.json and each captured kernel's module file, found
    without running the module (a kernel that cannot be imported fails its own trials,
    not the sweep's other kernels)."""
    capture_file = os.path.abspath(kernel.name[len(CAPTURE):])
    out = {capture_file: _digest(capture_file)}
    assert isinstance(kernel, CapturedKernel)
    for call in kernel.capture.calls:
        module_name = call.kernel.partition(":")[0]
        if call.root and call.root not in sys.path:
            sys.path.append(call.root)
        try:
            spec = importlib.util.find_spec(module_name)
        except Exception:  # a parent package failing to import: its trials say why
            continue
        if spec is not None and spec.origin and os.path.exists(spec.origin):
            out[os.path.abspath(spec.origin)] = _digest(spec.origin)
    return out


def _digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""
