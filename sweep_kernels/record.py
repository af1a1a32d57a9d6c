"""The Kernel record: what the sweep needs of a Triton kernel (the interface a user's kernel
implements, and a capture's record extends)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A kernel named "capture:PATH" is the capture in PATH (`sweep capture`).
CAPTURE = "capture:"

Problem = Mapping[str, Any]
Config = Mapping[str, Any]

# Bytes per element of the dtypes the built-in kernels take, without importing torch (as
# torch.finfo(dtype).bits / 8 would): the command that checks a spec never imports it.
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}

@dataclass(frozen=True)
class Kernel:
    """What the sweep needs of a Triton kernel.

    fn: the @triton.jit function; every config key is passed to it as a keyword
        (constexprs, and launch options such as num_warps and num_stages), and so is
        every fixed value.
    problem_defaults: every problem key with its default; a spec may override only these,
        with values of the same type. A "dtype" key takes one of DTYPES.
    make_inputs(problem, device, seed): input tensors, random and never all zeros.
    reference(inputs, problem): the expected output, computed with torch: a tensor, or a
        tuple of them in launch_args' order when the kernel writes several.
    launch_args(inputs, problem): (positional args for fn, the output it fills): a tensor,
        or a tuple (or list) of tensors, each validated against its reference.
    grid(problem, config): the launch grid; config holds the fixed values too.
    flops / bytes_moved(problem): work per launch, for TFLOP/s and GB/s in reports.
    baseline(inputs, problem): torch's own fastest way to the same output at the kernel's
        precision (`a @ b`, not the reference's float32 product): the speed to beat,
        timed beside the finalists on the same device and inputs. Without it the
        reference is timed, and reports say so.
    fixed: keyword arguments of fn that are not tuned (a mode flag, an epsilon) with
        their values, JSON scalars; a spec's `fixed:` overrides them, and a parameter the
        spec tunes drops its entry here. Not part of any config.
    """

    name: str
    fn: Any
    problem_defaults: Mapping[str, Any]
    make_inputs: Callable[[Problem, str, int], tuple[Any, ...]]
    reference: Callable[[tuple[Any, ...], Problem], Any]
    launch_args: Callable[[tuple[Any, ...], Problem], tuple[tuple[Any, ...], Any]]
    grid: Callable[[Problem, Config], tuple[int, ...]]
    flops: Callable[[Problem], float] | None = None
    bytes_moved: Callable[[Problem], float] | None = None
    baseline: Callable[[tuple[Any, ...], Problem], Any] | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def function(self, problem: Problem) -> Any:
        """The Triton function a problem launches (fn; a capture's record has one per
        problem)."""
        return self.fn

    def poisons_outputs(self) -> bool:
        """Whether the outputs are filled with NaN before a validated launch, so output the
        kernel never wrote cannot pass for the reference's."""
        return True

    def atol_scale(self, expected: Any) -> float:
        """What the spec's atol is a fraction of, for one expected output: 1 (atol is
        absolute) for a kernel with a torch reference."""
        return 1.0

    def arguments(self, inputs: tuple[Any, ...],
                  problem: Problem) -> tuple[tuple[Any, ...], Any, dict[str, Any]]:
        """(positional args, the output, keyword args) of a launch: launch_args' two, and
        the keywords a record passes its arguments by (a capture's, named as called)."""
        args, out = self.launch_args(inputs, problem)
        return args, out, {}
