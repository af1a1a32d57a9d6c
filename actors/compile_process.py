"""A compile process of the pool (actors/compile_pool.py): forked from a server that
imported torch, Triton and the kernel once (prepare), it makes the problem's launch
arguments once and compiles each config it is sent with Triton's `warmup`, which fills
Triton's on-disk cache without launching; it answers each with the compile's time or
error. The arguments are stand-ins that need no CUDA where they can be
(actors/compile_target.py), so a process is up in milliseconds and holds no GPU memory.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from actors import child, compile_target, trace, triton_warm

KEPT_PROBLEMS = 2  # problems whose launch arguments a compile process keeps


def prepare(spec_json: str) -> None:
    """In the fork server: the imports every compile process needs, done once."""
    spec = json.loads(spec_json)
    keying = triton_warm.key_triton()  # beside torch's import: every fork then has it
    import torch  # noqa: F401
    import triton  # noqa: F401

    from sweep_kernels import load_kernel

    kernel = load_kernel(spec["kernel"], spec["kernel_path"])
    keying.join()  # no thread may run across a fork
    if _target() is not None and "problem" in spec:  # NVML asked once, for every fork
        # Whatever making the stand-ins imports, where the meta device falls short
        # (FakeTensorMode, sympy: seconds), is imported once, here, not in every fork.
        with contextlib.suppress(Exception):
            compile_target.stand_ins(kernel, {**kernel.problem_defaults, **spec["problem"]},
                                     spec.get("seed", 0))
    trace.note("fork_server_prepared",
               heavy=[m for m in ("torch._dynamo", "sympy") if m in sys.modules])


def serve(read_fd: int, write_fd: int, spec_json: str) -> None:
    """A compile process: make the problem's launch arguments once (Triton specialises on
    dtypes, alignment and some integer values), then compile on request. A set-up that
    fails says why before the process ends. Each reply is (key, ms, error, binary): the
    hash of the binary compiled, which the launch checks it loads."""
    trace.note("compile_process_forked")
    inbox, outbox = child.connect(read_fd, write_fd)
    spec = json.loads(spec_json)
    try:
        compiler = _Compiler(spec, *_set_up(spec))
    except Exception as e:
        outbox.send(("failed", None, child.error_line(e), None))
        return
    outbox.send(("ready", None, None, None))
    while True:
        try:
            key, config = inbox.recv()
        except EOFError:
            return
        t0 = time.perf_counter()
        try:
            binary = compiler.compile(config)
            outbox.send((key, (time.perf_counter() - t0) * 1e3, None, binary))
        except SetUpLost as e:  # the process's, not the config's: the pool replaces it
            outbox.send(("failed", None, f"it could not set up the GPU ({e})", None))
            return
        except Exception as e:  # any other failure to compile is the config's
            text = "".join(traceback.format_exception_only(type(e), e)).strip()
            outbox.send((key, (time.perf_counter() - t0) * 1e3, text, None))


class _Compiler:
    """Compiles a config of the spec's kernel: with stand-ins for its arguments while
    they prove to compile what a launch loads (see compile), else with real ones."""

    def __init__(self, spec: dict[str, Any], kernel: Any, problem: dict[str, Any], args: Any,
                 fixed: dict[str, Any], arguments: Arguments) -> None:
        self.kernel, self.problem, self.fixed, self.arguments = kernel, problem, fixed, arguments
        self.seed = spec["seed"]
        self.keys = spec.get("problem_keys") or []
        # Launch arguments of the latest problems: a process holds few at a time, as a
        # problem's are cheap to make again next to a compile (milliseconds against
        # seconds) and every process of every worker would otherwise hold every problem's.
        self.made = collections.OrderedDict({repr(sorted(problem.items())): args})
        self.checked = arguments is _arguments

    def _args(self, problem: dict[str, Any]) -> Any:
        mark = repr(sorted(problem.items()))
        args = self.made.pop(mark, None) or self.arguments(self.kernel, problem, self.seed)
        self.made[mark] = args
        while len(self.made) > KEPT_PROBLEMS:
            self.made.popitem(last=False)
        return args

    def _on_the_gpu(self, problem: dict[str, Any]) -> Any:
        """From now on, compile as the launch will run: real arguments, CUDA set up; the
        problem's. SetUpLost where they cannot be made here (a fork of a server whose
        CUDA is set up): the pool starts another process, and the config goes to it."""
        compile_target.deactivate()
        self.arguments, self.made, self.checked = _arguments, collections.OrderedDict(), True
        try:
            return self._args(problem)
        except Exception as e:
            raise SetUpLost(child.error_line(e)) from None

    def _reaches(self, problem: dict[str, Any], args: Any, keywords: dict[str, Any],
                 compiled: Any) -> bool:
        """Whether real tensors of the stand-ins' geometry reach their binary: checked
        once, or the pool would fill the cache with binaries no launch looks up. The
        check's failure is never the config's."""
        try:
            return _compile(self.kernel, problem, compile_target.real_twins(args),
                            keywords) is compiled
        except Exception:
            return False

    def compile(self, config: dict[str, Any]) -> str | None:
        """Compile config; the hash of its binary (None where Triton has none to say)."""
        problem = self.problem
        if self.keys:  # a sweep over problems: this config's problem
            problem = {**problem, **{k: config[k] for k in self.keys}}
            config = {k: v for k, v in config.items() if k not in self.keys}
        keywords = {**self.fixed, **config}
        if self.arguments is not _arguments:
            try:
                args = self._args(problem)
            except Exception:  # stand-ins this problem's make_inputs cannot take
                args = None
            if args is not None:
                try:
                    compiled = _compile(self.kernel, problem, args, keywords)
                except Exception as e:
                    # Once the stand-ins have proved themselves, or for Triton's own word
                    # on the config, the error is the config's; a first failure may be
                    # the stand-ins', and the config is compiled again as launched.
                    if self.checked or compile_target.the_configs(e):
                        raise
                    compiled = None
                if compiled is not None and not self.checked:
                    self.checked = self._reaches(problem, args, keywords, compiled)
                if compiled is not None and self.checked:
                    compile_target.build_launcher(compiled)  # the limits are the launch's
                    return getattr(compiled, "hash", None)
            real = self._on_the_gpu(problem)
        else:
            real = self._args(problem)
        compiled = _compile(self.kernel, problem, real, keywords)
        # Loading it checks the GPU's limits (shared memory, threads per block) and builds
        # Triton's launcher, both off the GPU's critical path.
        init_handles = getattr(compiled, "_init_handles", None)
        if init_handles is not None:
            init_handles()
        return getattr(compiled, "hash", None)


class SetUpLost(Exception):
    """A process that went over to real arguments could not make them."""


Arguments = Callable[[Any, dict[str, Any], int], tuple[tuple[Any, ...], dict[str, Any]]]


def _set_up(spec: dict[str, Any]) -> tuple[Any, dict[str, Any], Any, dict[str, Any], Arguments]:
    """The kernel, the problem, its launch arguments, the fixed keyword arguments and
    how to make a problem's arguments: stand-ins that need no CUDA where possible
    (actors/compile_target.py), else real ones on the GPU."""
    # Compiling is throughput work; the launcher feeding the GPU must never wait for a CPU.
    os.nice(10)
    if "device" in spec:  # before anything touches CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = spec["device"]
    from sweep_kernels import load_kernel

    kernel = load_kernel(spec["kernel"], spec["kernel_path"])
    # A spec's problem as written, before its kernel's defaults were merged, is enough.
    problem = {**kernel.problem_defaults, **spec["problem"]}
    # As the launcher passes them (actors/triton_backend.py): a compile for other
    # keyword values would fill the cache with a binary nobody launches.
    fixed = {**kernel.fixed, **spec["fixed"]}
    target = _target() if spec.get("stand_ins", True) else None
    if target is not None and compile_target.activate(target):
        try:
            args = compile_target.stand_ins(kernel, problem, spec["seed"])
            return kernel, problem, args, fixed, compile_target.stand_ins
        except Exception:  # a make_inputs fake tensors cannot run: real ones, then
            compile_target.deactivate()
    return kernel, problem, _arguments(kernel, problem, spec["seed"]), fixed, _arguments


def _target() -> tuple[int, int] | None:
    """The GPU target stand-ins compile for; None where they are not used (the
    interpreter, SWEEP_STAND_INS=0, no target NVML can name)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("SWEEP_STAND_INS") == "0":
        return None
    return compile_target.gpu_target()


def _compile(kernel: Any, problem: dict[str, Any], args: Any, keywords: dict[str, Any]) -> Any:
    positional, passed = args
    # Merged as the launch merges them (actors/triton_backend.py): the config's last.
    return kernel.function(problem).warmup(
        *positional, grid=kernel.grid(problem, keywords), **{**passed, **keywords})


def _arguments(kernel: Any, problem: dict[str, Any],
               seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional, keyword) launch arguments of the problem's inputs."""
    from actors.triton_backend import copied

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    inputs = copied(kernel.make_inputs(problem, device, seed))  # as the launch's are
    args, _, passed = kernel.arguments(inputs, problem)
    return args, passed
