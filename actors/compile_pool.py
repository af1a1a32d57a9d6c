"""Compile configs ahead of the GPU, in parallel processes, each compile with a hard limit.

Compiling is most of an autotuner's time, so a GPU worker keeps a pool of processes that
compile the configs it will time next (Triton's `warmup`, which compiles without
launching) while it times the current one; its own first launch then loads the binary from
Triton's on-disk cache, shared by every process of the user on the node. A compile past
its limit is killed with its whole process group (Triton runs ptxas as a child) and the
process replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any


@dataclass(frozen=True)
class Compiled:
    ok: bool
    compile_ms: float | None
    error: str | None = None
    timed_out: bool = False


def serve(read_fd: int, write_fd: int, spec_json: str) -> None:
    """A compile process: build launch arguments of the real types and values once (Triton
    specialises on dtypes, alignment and some integer values), then compile on request."""
    _die_with_parent()
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    spec = json.loads(spec_json)
    from kernels import load_kernel

    kernel = load_kernel(spec["kernel"])
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
            kernel.fn.warmup(*args, grid=kernel.grid(problem, config), **config)
            outbox.send((key, (time.perf_counter() - t0) * 1e3, None))
        except Exception as e:  # any failure to compile is the config's, not the pool's
            text = "".join(traceback.format_exception_only(type(e), e)).strip()
            outbox.send((key, (time.perf_counter() - t0) * 1e3, text))


def _die_with_parent() -> None:
    """In its own session a compile process would outlive a killed worker: ask Linux to
    kill it when its parent goes (PR_SET_PDEATHSIG); elsewhere the closed pipe ends it."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PDEATHSIG


@dataclass
class _Proc:
    process: subprocess.Popen
    conn: Connection  # replies from the process
    inbox: Connection  # requests to it
    ready: bool = False
    task: tuple[int, Mapping[str, Any]] | None = None
    since: float = 0.0


class CompilePool:
    def __init__(self, size: int, kernel_name: str, problem: Mapping[str, Any], seed: int,
                 timeout_s: float) -> None:
        self._spec = json.dumps({"kernel": kernel_name, "problem": dict(problem), "seed": seed})
        self.timeout_s = timeout_s
        self._failed_starts = 0
        self._procs = [self._start() for _ in range(max(1, size))]
        self._queue: deque[tuple[int, Mapping[str, Any]]] = deque()
        self._done: dict[int, Compiled] = {}
        self._retried: set[int] = set()

    @property
    def size(self) -> int:
        return len(self._procs)

    def _start(self) -> _Proc:
        # A plain subprocess rather than multiprocessing's spawn, which would re-import the
        # Ray worker's main script; its own session, so a kill reaches ptxas too.
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from actors.compile_pool import serve; "
             "serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])",
             str(child_reads), str(child_writes), self._spec],
            pass_fds=(child_reads, child_writes), start_new_session=True)
        os.close(child_reads)
        os.close(child_writes)
        return _Proc(process, Connection(parent_reads, writable=False),
                     Connection(parent_writes, readable=False), since=time.monotonic())

    def submit(self, key: int, config: Mapping[str, Any]) -> None:
        self._queue.append((key, config))
        self._pump(0.0)

    def result(self, key: int) -> Compiled:
        """Block until `key` is compiled, failed, or timed out."""
        while key not in self._done:
            if not any(p.task and p.task[0] == key for p in self._procs) and \
                    all(k != key for k, _ in self._queue):
                raise KeyError(f"config {key} was never submitted")
            self._pump(0.05)
        return self._done.pop(key)

    def wait_ready(self) -> None:
        while not all(p.ready for p in self._procs):
            self._pump(0.05)

    def _pump(self, wait_s: float) -> None:
        for i, p in enumerate(self._procs):
            if p.ready and p.task is None and self._queue:
                p.task, p.since = self._queue.popleft(), time.monotonic()
                try:
                    p.inbox.send(p.task)
                except OSError:  # it died while idle: the task was never its fault
                    self._queue.appendleft(p.task)
                    p.task = None
                    self._replace(i, "the compile process died")
        ready = wait([p.conn for p in self._procs], timeout=wait_s)
        for i, p in enumerate(self._procs):
            if p.conn in ready:
                try:
                    key, ms, error = p.conn.recv()
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
        _kill(p)
        self._procs[i] = self._start()

    def close(self) -> None:
        for p in self._procs:
            _kill(p)


def _kill(p: _Proc) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.process.pid, signal.SIGKILL)
    p.process.kill()
    p.process.wait(timeout=5)
    p.conn.close()
    p.inbox.close()
