"""Compile configs ahead of the GPU, in parallel processes, each compile with a hard limit.

Compiling is most of an autotuner's time, so a GPU worker keeps a pool of processes that
compile the configs it will time next (Triton's `warmup`, which compiles without
launching) while it times the current one; its own first launch then loads the binary from
Triton's on-disk cache, shared by every process of the user on the node. A compile past
its limit is killed with its whole process group and the process replaced.

Besides the configs its worker will time (`submit`), the pool takes hints of configs the
sweep will hand out soon to some worker (`hint`): idle processes compile those into the
shared cache. Without them a few slow compiles at the end of a sweep, handed out one at a
time as the queue drains, run one after another while the rest of the pool idles.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from actors import child


@dataclass(frozen=True)
class Compiled:
    ok: bool
    compile_ms: float | None
    error: str | None = None
    timed_out: bool = False


def serve(read_fd: int, write_fd: int, spec_json: str) -> None:
    """A compile process: build launch arguments of the real types and values once (Triton
    specialises on dtypes, alignment and some integer values), then compile on request."""
    inbox, outbox = child.connect(read_fd, write_fd)
    # Compiling is throughput work; the launcher feeding the GPU must never wait for a CPU.
    os.nice(10)
    spec = json.loads(spec_json)
    from sweep_kernels import load_kernel

    kernel = load_kernel(spec["kernel"], spec["kernel_path"])
    problem = spec["problem"]
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    inputs = kernel.make_inputs(problem, device, spec["seed"])
    args, _ = kernel.launch_args(inputs, problem)
    outbox.send(("ready", None, None))
    while True:
        try:
            key, config = inbox.recv()
        except EOFError:
            return
        t0 = time.perf_counter()
        try:
            compiled = kernel.fn.warmup(*args, grid=kernel.grid(problem, config), **config)
            # Loading it here checks the GPU's limits (shared memory, threads per block) and
            # builds Triton's launcher for the signature, both off the GPU's critical path.
            init_handles = getattr(compiled, "_init_handles", None)
            if init_handles is not None:
                init_handles()
            outbox.send((key, (time.perf_counter() - t0) * 1e3, None))
        except Exception as e:  # any failure to compile is the config's, not the pool's
            text = "".join(traceback.format_exception_only(type(e), e)).strip()
            outbox.send((key, (time.perf_counter() - t0) * 1e3, text))


@dataclass
class _Proc:
    child: child.Child
    ready: bool = False
    task: tuple[int, Mapping[str, Any]] | None = None
    since: float = 0.0


class CompilePool:
    def __init__(self, size: int, kernel_name: str, problem: Mapping[str, Any], seed: int,
                 timeout_s: float, kernel_path: str = "") -> None:
        self._spec = json.dumps({"kernel": kernel_name, "kernel_path": kernel_path,
                                 "problem": dict(problem), "seed": seed})
        self.timeout_s = timeout_s
        self._failed_starts = 0
        self._procs = [self._start() for _ in range(max(1, size))]
        self._queue: deque[tuple[int, Mapping[str, Any]]] = deque()
        self._hints: dict[int, Mapping[str, Any]] = {}  # compiled when nothing is queued
        self._done: dict[int, Compiled] = {}
        self._retried: set[int] = set()
        # The batch being timed waits on results while the next batch submits its configs
        # from another thread of the worker.
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return len(self._procs)

    def _start(self) -> _Proc:
        return _Proc(child.start("actors.compile_pool:serve", self._spec),
                     since=time.monotonic())

    def submit(self, key: int, config: Mapping[str, Any]) -> None:
        with self._lock:
            self._hints.pop(key, None)
            if key not in self._done and not self._in_flight(key):
                self._queue.append((key, config))
            self._pump()

    def hint(self, key: int, config: Mapping[str, Any]) -> None:
        with self._lock:
            if key not in self._done and not self._in_flight(key):
                self._hints[key] = config
            self._pump()

    def _in_flight(self, key: int) -> bool:
        """Queued or compiling now (a hint is neither until a process takes it)."""
        return any(p.task is not None and p.task[0] == key for p in self._procs) or \
            any(k == key for k, _ in self._queue)

    def result(self, key: int) -> Compiled:
        """Block until `key` is compiled, failed, or timed out."""
        while True:
            with self._lock:
                self._pump()
                if key in self._done:
                    return self._done.pop(key)
                if not self._in_flight(key):
                    raise KeyError(f"config {key} was never submitted")
            self._idle()

    def wait_ready(self) -> None:
        while True:
            with self._lock:
                self._pump()
                if all(p.ready for p in self._procs):
                    return
            self._idle()

    def _idle(self) -> None:
        """Wait for a reply without the lock: a thread holding it across the wait would
        keep a submitting thread out (Python's locks are not fair) until its own result
        came, and the next batch would start compiling only then."""
        with self._lock:
            replies = [p.child.replies for p in self._procs]
        with contextlib.suppress(OSError, ValueError):  # a process replaced meanwhile
            wait(replies, timeout=0.05)

    def _pump(self) -> None:
        """Hand queued configs to idle processes; take every reply that has arrived."""
        for i, p in enumerate(self._procs):
            if p.ready and p.task is None and (self._queue or self._hints):
                task = self._queue.popleft() if self._queue else self._next_hint()
                p.task, p.since = task, time.monotonic()
                try:
                    p.child.requests.send(p.task)
                except OSError:  # it died while idle: the task was never its fault
                    self._queue.appendleft(p.task)
                    p.task = None
                    self._replace(i, "the compile process died")
        ready = wait([p.child.replies for p in self._procs], timeout=0)
        for i, p in enumerate(self._procs):
            if p.child.replies in ready:
                try:
                    key, ms, error = p.child.replies.recv()
                except EOFError:  # the compile process died (a crash inside the compiler)
                    if not p.ready:
                        self._failed_starts += 1
                        if self._failed_starts > 3:
                            raise RuntimeError("compile processes keep dying at start-up") from None
                    self._replace(i, "the compile process died")
                    continue
                if key == "ready":
                    p.ready, self._failed_starts = True, 0
                    continue
                self._done[key] = Compiled(ok=error is None, compile_ms=ms, error=error)
                p.task = None
            elif p.task is not None and time.monotonic() - p.since > self.timeout_s:
                self._replace(i, f"compile took longer than {self.timeout_s:g} s", True)

    def _next_hint(self) -> tuple[int, Mapping[str, Any]]:
        key = next(iter(self._hints))  # the oldest: the sweep hands configs out in order
        return key, self._hints.pop(key)

    def _replace(self, i: int, why: str, timed_out: bool = False) -> None:
        p = self._procs[i]
        if p.task is not None:
            key = p.task[0]
            if not timed_out and key not in self._retried:
                # A death may not be this config's doing (the process may have died
                # before reading it): one more try before the config takes the blame.
                self._retried.add(key)
                self._queue.appendleft(p.task)
            else:
                ms = (time.monotonic() - p.since) * 1e3
                self._done[key] = Compiled(False, ms, why, timed_out=timed_out)
        child.kill(p.child)
        self._procs[i] = self._start()

    def close(self) -> None:
        with self._lock:
            for p in self._procs:
                child.kill(p.child)

