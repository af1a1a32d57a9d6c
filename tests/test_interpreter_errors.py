"""What a trial's error says where Triton's CPU interpreter is to blame, or where the
kernel left an output unwritten: real kernels (defined here, launched as a worker
launches them, in a launcher process under the interpreter)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from sweep_kernels import Kernel

TESTS = Path(__file__).parent
N = 300


@triton.jit
def two_outputs(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr, WRITE: tl.constexpr):
    """y = 2x always; z = 2x where WRITE is 3, 3x (wrong) where 2, its first half only
    where 1, never where 0."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2, mask=mask)
    if WRITE == 1:
        tl.store(z_ptr + offs, x * 2, mask=mask & (offs < n // 2))
    if WRITE == 2:
        tl.store(z_ptr + offs, x * 3, mask=mask)
    if WRITE == 3:
        tl.store(z_ptr + offs, x * 2, mask=mask)


@triton.jit
def scaled_by_eps(x_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
    """`eps.to(...)` on a float argument: compiled, eps is a float32 scalar and this runs
    (checked on an H200, Triton 3.6); the interpreter passes a Python float, which has no
    `.to` (Liger-Kernel's LayerNorm fails so)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * eps.to(tl.float32), mask=mask)


def _inputs(problem, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.rand(problem["n"], generator=gen, device=device) + 0.5,)


def _two_launch_args(inputs, problem):
    (x,) = inputs
    y, z = torch.empty_like(x), torch.empty_like(x)
    return (x, y, z, x.numel()), (y, z)


def _grid(problem, config):
    return (triton.cdiv(problem["n"], config["BLOCK"]),)


def _eps_launch_args(x):
    y = torch.empty_like(x)
    return (x, y, x.numel(), 0.5), y


TWO_OUTPUTS = Kernel(
    name="two_outputs", fn=two_outputs, problem_defaults={"n": N}, make_inputs=_inputs,
    reference=lambda inputs, problem: (inputs[0] * 2, inputs[0] * 2),
    launch_args=_two_launch_args, grid=_grid)

SCALED_BY_EPS = Kernel(
    name="scaled_by_eps", fn=scaled_by_eps, problem_defaults={"n": N}, make_inputs=_inputs,
    reference=lambda inputs, problem: inputs[0] * 0.5,
    launch_args=lambda inputs, problem: _eps_launch_args(inputs[0]), grid=_grid)


def _launcher(kernel: str):
    from actors.launcher import Launcher
    from actors.protocol import WorkerSettings
    from actors.worker import launcher_payload

    return Launcher(launcher_payload(WorkerSettings(
        backend="interpret", kernel=kernel, problem={}, trial_timing=(1, 3),
        finalist_timing=(1, 3), tolerance=(0.01, 0.01), seed=0, simulate={},
        kernel_path=str(TESTS))))


@pytest.fixture(scope="module")
def launchers():
    from actors import child

    started = {name: _launcher(kernel) for name, kernel in (
        ("two outputs", "test_interpreter_errors:TWO_OUTPUTS"),
        ("eps", "test_interpreter_errors:SCALED_BY_EPS"),
        ("faulty", "faulty"))}
    yield started
    for one in started.values():
        if one._child is not None:
            child.kill(one._child)


def test_an_output_the_kernel_never_wrote_is_reported_as_not_written(launchers):
    outcome = launchers["two outputs"].run_trial({"BLOCK": 64, "WRITE": 0})
    assert (outcome.status, outcome.validation) == ("incorrect", "failed"), outcome
    assert outcome.error == ("output 2 of 2 was not written by the kernel "
                             f"({N} of {N} values still NaN)")


def test_an_output_the_kernel_wrote_in_part_says_how_many_values_are_left(launchers):
    outcome = launchers["two outputs"].run_trial({"BLOCK": 64, "WRITE": 1})
    assert (outcome.status, outcome.validation) == ("incorrect", "failed"), outcome
    assert outcome.error == ("output 2 of 2 was not fully written by the kernel "
                             f"({N - N // 2} of {N} values still NaN)")


def test_wrong_numbers_keep_the_max_abs_error_wording(launchers):
    two = launchers["two outputs"]
    outcome = two.run_trial({"BLOCK": 64, "WRITE": 2})
    assert outcome.status == "incorrect"
    assert outcome.error.startswith("output 2 of 2 differs from the reference: max abs error ")
    assert outcome.error.endswith("(rtol=0.01, atol=0.01)")
    right = two.run_trial({"BLOCK": 64, "WRITE": 3})
    assert (right.status, right.validation) == ("ok", "passed"), right


def test_a_kernel_the_interpreter_cannot_run_names_the_interpreter_first(launchers):
    from actors.triton_backend import UNDER_INTERPRETER

    outcome = launchers["eps"].run_trial({"BLOCK": 64})
    assert (outcome.status, outcome.validation) == ("runtime_error", "skipped"), outcome
    assert outcome.error.startswith(UNDER_INTERPRETER + "InterpreterError: "), outcome.error
    # The original error follows, whole.
    assert "AttributeError" in outcome.error
    assert "'float' object has no attribute 'to'" in outcome.error


def test_a_language_rule_broken_under_the_interpreter_stays_a_compile_error_unprefixed(
        launchers):
    from actors.triton_backend import UNDER_INTERPRETER

    outcome = launchers["faulty"].run_trial({"BLOCK": 48, "MODE": 0})
    assert outcome.status == "compile_error" and "power of 2" in outcome.error
    assert not outcome.error.startswith(UNDER_INTERPRETER)


def test_the_interpreter_note_and_a_long_error_are_clipped_together():
    from actors.triton_backend import UNDER_INTERPRETER, TritonBackend
    from storage.records import MAX_ERROR_CHARS

    interpreted = SimpleNamespace(interpret=True)
    long = TritonBackend._launch_failure(interpreted, RuntimeError("x" * 3 * MAX_ERROR_CHARS),
                                         None)
    assert long.status == "runtime_error" and len(long.error) == MAX_ERROR_CHARS
    assert long.error.startswith(UNDER_INTERPRETER + "RuntimeError: xxx")
    assert long.error.endswith(" …[truncated]")
    compiled = TritonBackend._launch_failure(SimpleNamespace(interpret=False),
                                             RuntimeError("boom"), None)
    assert compiled.error == "RuntimeError: boom"  # on a GPU, nothing to blame but the kernel
