"""Checking a spec against the kernel it names, which means importing it: kept apart so that
nothing here runs for a kernel-free backend or for load_spec(import_kernel=False)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.backends import AUTO, traits
from sweep.spec.constraints import clip_repr, clip_text
from sweep.spec.import_output import printed_aside
from sweep.spec.model import LAUNCH_OPTIONS, SpecError
from sweep.spec.rules import Reader, is_json_scalar, is_number
from sweep_kernels import (
    DTYPES,
    Kernel,
    KernelError,
    load_kernel,
    source_digest,
    source_files,
)
from sweep_kernels.captured import CapturedKernel


@dataclass(frozen=True)
class KernelFacts:
    """What the spec holds from its kernel: the problem and fixed values with the kernel's
    defaults merged in (or as written, when it is not imported), its sources and its work."""

    problem: dict[str, Any]
    fixed: dict[str, Any]
    source: str = ""  # SHA-256 of the kernel's source
    files: dict[str, str] = field(default_factory=dict)
    work: dict[str, float] = field(default_factory=dict)
    problems: tuple[dict[str, Any], ...] = ()  # each of `problems:`, merged likewise
    problem_work: tuple[dict[str, float], ...] = ()


@dataclass(frozen=True)
class Spaces:
    """What a spec tunes: its space (under `where`: its key, space or configs), and each
    problem's own space's key and values (None where it tunes the spec's)."""

    space: Mapping[str, list[Any]]
    own: Sequence[tuple[str, Mapping[str, list[Any]]] | None] = ()
    where: str = "space"


def kernel_facts(r: Reader, kernel_name: str, problem: Mapping[str, Any],
                 fixed: Mapping[str, Any], spaces: Spaces, backend: str,
                 problems: Sequence[Mapping[str, Any]] = ()) -> KernelFacts:
    """Import the kernel and check the spec's problem (and each of its problems, as
    written merged over it), fixed values and spaces against it."""
    try:
        with printed_aside(f"kernel {kernel_name}'s module"):
            kernel = load_kernel(kernel_name)
    except KernelError as e:
        raise r.fail("kernel", clip_text(str(e), 300)) from None
    merged_problem = check_problem(r, kernel, dict(problem), backend)
    if isinstance(kernel, CapturedKernel):  # each problem's configs are its kernel's own
        if fixed:
            raise r.fail("fixed", "a capture's kernels take every argument from the call "
                                  "captured; nothing can be fixed")
        merged_fixed: dict[str, Any] = {}
        check_captured(r, kernel, problems or (problem,))
    else:
        merged_fixed = check_spaces(r, kernel, fixed, spaces)
    each = tuple(check_problem(r, kernel, dict(p), backend, f"problems[{i}]")
                 for i, p in enumerate(problems))
    return KernelFacts(problem=merged_problem, fixed=merged_fixed,
                       source=source_digest(kernel_name, kernel),
                       files=source_files(kernel_name, kernel),
                       work=work_per_launch(kernel, merged_problem), problems=each,
                       problem_work=tuple(work_per_launch(kernel, p) for p in each))


def check_spaces(r: Reader, kernel: Kernel, fixed: Mapping[str, Any],
                 spaces: Spaces) -> dict[str, Any]:
    """The fixed values merged over the kernel's, and each space the spec tunes (the
    spec's where a problem tunes it, each problem's own) checked against its signature."""
    space, own, where = spaces.space, spaces.own, spaces.where
    every = {**space, **{name: [] for mine in own if mine for name in mine[1]}}
    merged_fixed = check_fixed(r, kernel, fixed, every)
    if not own or not all(own):
        check_parameters(r, kernel, space, merged_fixed, where)
    for i, mine in enumerate(own):
        if mine is not None:
            check_parameters(r, kernel, mine[1], merged_fixed, f"problems[{i}].{mine[0]}")
    return merged_fixed


def check_captured(r: Reader, kernel: CapturedKernel,
                   problems: Sequence[Mapping[str, Any]]) -> None:
    """Every problem is a call the capture holds."""
    for i, p in enumerate(problems):
        why = kernel.problem_error({**kernel.problem_defaults, **p})
        if why is not None:
            raise r.fail(f"problems[{i}]" if len(problems) > 1 or "key" not in p
                         else "problem", clip_text(why, 300))


def work_per_launch(kernel: Kernel, problem: Mapping[str, Any]) -> dict[str, float]:
    """What the kernel says it does per launch. A function that fails or answers nonsense
    costs the report its throughput figures, never the run."""
    out: dict[str, float] = {}
    for key in ("flops", "bytes_moved"):
        fn = getattr(kernel, key)
        try:
            value = float(fn(problem)) if fn is not None else None
        except Exception:
            value = None
        if value is not None and math.isfinite(value) and value > 0:
            out[key] = value
    return out


def check_problem(r: Reader, kernel: Kernel, given: dict[str, Any],
                  backend: str, where: str = "problem") -> dict[str, Any]:
    """given merged over the kernel's defaults, each value checked against its default's
    type; where: the key messages name (`problem`, or `problems[3]`)."""
    problem = dict(kernel.problem_defaults)
    for key, value in given.items():
        if key not in problem:
            known = clip_text(", ".join(problem), 200)
            raise r.fail(f"{where}.{key}", f"unknown key for kernel {kernel.name} "
                                           f"(expected one of {known})")
        default = problem[key]
        if key == "dtype":
            if value not in DTYPES:
                raise r.fail(f"{where}.dtype", f"expected one of {', '.join(DTYPES)}, "
                                               f"got {clip_repr(value)}")
        elif isinstance(default, bool) or type(value) is not type(default):
            raise r.fail(f"{where}.{key}", f"expected {type(default).__name__}, "
                                           f"got {clip_repr(value)}")
        elif is_number(value) and value <= 0:
            raise r.fail(f"{where}.{key}", f"expected a number > 0, got {clip_repr(value)}")
        problem[key] = value
    check_dtype_for_backend(r.path, problem, backend, where)
    return problem


def check_dtype_for_backend(path: Path, problem: Mapping[str, Any], backend: str,
                            where: str = "problem") -> None:
    # Triton's CPU interpreter computes bfloat16 wrongly (seen with triton 3.9): every trial
    # would be recorded `incorrect`, so refuse up front.
    if backend != AUTO and traits(backend).interpreted and problem.get("dtype") == "bfloat16":
        raise SpecError(f"{path}: {where}.dtype: bfloat16 is not supported by Triton's CPU "
                        "interpreter; use float16 or float32, or run on a GPU")


def _signature(kernel: Kernel) -> list[inspect.Parameter]:
    fn = getattr(kernel.fn, "fn", kernel.fn)  # JITFunction wraps the Python function
    return list(inspect.signature(fn).parameters.values())


def _keywords(kernel: Kernel) -> list[str]:
    """What may be fixed: a constexpr, or a parameter with a default (a scalar such as
    eps). The others (pointers, sizes, strides) are launch_args' to pass, by position: a
    fixed value for one would fail every trial with "multiple values for argument"."""
    return [p.name for p in _signature(kernel)
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and ("constexpr" in str(p.annotation) or p.default is not inspect.Parameter.empty)]


def check_fixed(r: Reader, kernel: Kernel, written: Mapping[str, Any],
                 space: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The kernel record's fixed values with the spec's over them. A default the spec tunes
    is dropped: tuning a parameter overrides its default, as a spec's value does."""
    keywords = _keywords(kernel)
    names = clip_text(", ".join(keywords), 300)
    for name, v in kernel.fixed.items():
        if name not in keywords or not is_json_scalar(v):
            raise r.fail("kernel", f"kernel {kernel.name}'s own fixed value "
                                   f"{clip_repr(name, 40)}: {clip_repr(v, 40)}: expected one "
                                   f"of its function's parameters ({names}) with a string, an "
                                   "integer, a finite number or a boolean")
    every = [p.name for p in _signature(kernel)]
    for name in written:
        if name in every and name not in keywords:
            raise r.fail(f"fixed.{name}", f"kernel {kernel.name} gets it from launch_args, by "
                                          "position; fixed: takes its tl.constexpr parameters "
                                          f"and those with a default ({names})")
        if name not in keywords:
            raise r.fail(f"fixed.{name}", f"not a parameter of kernel {kernel.name} "
                                          f"(expected one of {names})")
    return {**{k: v for k, v in kernel.fixed.items() if k not in space}, **written}


def check_parameters(r: Reader, kernel: Kernel, space: Mapping[str, list[Any]],
                      fixed: Mapping[str, Any], where: str = "space") -> None:
    """Every name of the space (where: its key) is a constexpr of the kernel or a launch
    option, and every constexpr without a default has a value."""
    params = _signature(kernel)
    constexprs = [p.name for p in params if "constexpr" in str(p.annotation)]
    required = [p.name for p in params
                if "constexpr" in str(p.annotation) and p.default is inspect.Parameter.empty]
    for name in space:
        if name not in constexprs and name not in LAUNCH_OPTIONS:
            raise r.fail(f"{where}.{name}", f"not a parameter of kernel {kernel.name} (expected "
                                          f"one of {', '.join(constexprs + list(LAUNCH_OPTIONS))})")
    missing = [c for c in required if c not in space and c not in fixed]
    if missing:
        raise r.fail(where, f"kernel {kernel.name} needs a value list (or a value under "
                              f"fixed:) for {', '.join(missing)}")
