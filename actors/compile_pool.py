"""Compile configs ahead of the GPU, in parallel processes, each compile with a limit.

Compiling is most of an autotuner's time, so a GPU worker keeps a pool of processes that
compile the configs it will time next (Triton's `warmup`, which compiles without
launching) while it times the current one; its own first launch then loads the binary from
Triton's on-disk cache, shared by every process of the user on the node. A compile past
its limit is killed with its whole process group and the process replaced. The processes
(actors/compile_process.py) are forked from a server that imported torch, Triton and the
kernel once, and set no CUDA up where they can help it: each is up in milliseconds.

Besides the configs its worker will time (`submit`), the pool takes hints of configs the
sweep will hand out soon to some worker (`hint`): idle processes compile those into the
shared cache, so a few slow compiles at the end of a sweep do not run one after another.
Submitted configs always go first.

In a sweep over problems a kernel config's problems mostly share one binary (Triton
specialises an integer on its divisibility by 16, not its value): compiled by several
processes at once, each paid the whole compile (0 cache hits in 544 on an H200, results/
heavy_compiles_adopt_shapes_empty-2026-12-03.parquet). So a process starts no config whose
binary another is compiling; the rest then find it in Triton's cache. A binary its
problems do not share after all (a second compile that was no cache hit: M = 1, a size the
kernel takes as a constexpr) or that compiled past the limit (none reached the cache) is
held back no more.

A kernel's own package may leave the fork server unfit to fork from: one that asks torch
for the GPU at import (Liger-Kernel calls torch.cuda.is_available()) initialises CUDA there,
and a forked child's CUDA then refuses to start ("Cannot re-initialize CUDA in forked
subprocess"). The server asks NVML instead where torch allows it (FORK_SAFE_ENV); a fork
that still cannot start makes the pool start its processes on their own from then on, each
importing for itself. Processes that cannot start even so leave the pool down, never the
worker: it compiles each config itself, as before the pool is up. Either way the pool says
why, once (notices()).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import IO, Any

from actors import child, trace
from actors.compile_limit import CACHE_HIT_MS, Learner, Stopped, tighter
from actors.compiles import Compiled
from actors.protocol import CompileLimit, WorkerSettings
from storage.records import canonical_json

# In the fork server and its children: torch.cuda.is_available() asks NVML rather than
# CUDA, which once initialised does not survive a fork (torch's "poison fork").
FORK_SAFE_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
# A process of its own not up by then has failed to start (it imports torch and the
# kernel first).
START_LIMIT_S = 120.0
# Failed starts in a row, with none up meanwhile, after which a slot stays empty (and
# the pool is down once none is up).
MAX_FAILED_STARTS = 3
PUMP_S = 0.05  # the longest a compile past its limit runs on unseen by the pool's pumping
NOTICE_CHARS = 300  # the longest reason a notice quotes


@dataclass
class _Proc:
    child: child.Child
    forked: bool
    ready: bool = False
    task: tuple[int, Mapping[str, Any]] | None = None
    since: float = 0.0  # when it started, then when its task did


@dataclass(frozen=True)
class CompileJob:
    """What a pool's processes compile: the kernel (a built-in's name, or module:attr,
    looked for on kernel_path too), the problem whose arguments it compiles for, the seed
    its inputs are made with, the spec's fixed keyword arguments, and in a sweep over
    problems the keys a config carries its problem in."""

    kernel: str
    problem: Mapping[str, Any]
    seed: int = 0
    kernel_path: str = ""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    problem_keys: Sequence[str] = ()

    @classmethod
    def of(cls, settings: WorkerSettings) -> CompileJob:
        return cls(settings.kernel, settings.problem, settings.seed, settings.kernel_path,
                   settings.fixed, settings.problem_keys)


class CompilePool:
    def __init__(self, size: int, job: CompileJob, limit: CompileLimit,
                 devices: Sequence[str] = (), stderr: IO[bytes] | None = None,
                 unforked: bool = True, adaptive: bool = False,
                 forks: tuple[str, str, int] | None = None) -> None:
        """devices: GPU ids to spread the processes over (where one sets up CUDA for its
        launch arguments: actors/compile_process.py); default: the one this process sees.
        stderr: where the processes write theirs. unforked: whether processes start on
        their own where forks cannot (each imports torch and the kernel itself: seconds of
        CPU), or the pool stays down. adaptive: the pool also learns a limit from its own
        compiles as each ends (actors/compile_limit.py), and a compile stops at the
        tighter of that and the one it was given. forks: the (address, key, pid) of a fork
        server started before this pool (child.serve_prepared) to fork its processes
        from, rather than import torch and the kernel once more."""
        self._keys = frozenset(job.problem_keys)
        # In a sweep over problems: each config's binary (see _note_binary), those compiled
        # once, and those its problems turned out not to share.
        self._binaries: dict[int, str] = {}
        self._built: set[str] = set()
        self._unshared: set[str] = set()
        self._spec = {"kernel": job.kernel, "kernel_path": job.kernel_path,
                      "problem": dict(job.problem), "seed": job.seed, "fixed": dict(job.fixed),
                      "problem_keys": list(job.problem_keys)}
        self._devices = list(devices)
        self.limit = limit  # the one in force: the tighter of the given and the learnt
        self._given = limit
        self._learner = Learner(limit.seconds, adaptive)
        self._stopped = Stopped(job.problem_keys)  # what a learnt limit stopped
        # Configs its worker was sent: a hint stopped here is another worker's, compiled
        # there under that worker's limit, and rules nothing out here.
        self._submitted: set[int] = set()
        self._stderr = stderr
        self._unforked = unforked
        self._failed_starts = 0
        self._forking = True
        self._down: str | None = None  # why no process can start: the pool stays down
        self._notices: list[str] = []
        trace.note("compile_pool_started", adopted=bool(forks))
        self._server = (child.ForkServer.adopt(*forks) if forks else None) or \
            child.ForkServer("actors.compile_process:prepare", json.dumps(self._spec), stderr,
                             env={**os.environ, **FORK_SAFE_ENV})
        self._procs: list[_Proc | None] = [self._start(i) for i in range(max(1, size))]
        self._queue: deque[tuple[int, Mapping[str, Any]]] = deque()
        self._hints: dict[int, Mapping[str, Any]] = {}  # compiled when nothing is queued
        self._done: dict[int, Compiled] = {}
        self._configs: dict[int, Mapping[str, Any]] = {}  # of each compile handed out
        self._retried: set[int] = set()
        # The runner takes results while batches submit their configs from other threads.
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)  # notified as replies are read
        self._replies = 0  # read so far
        self._seen = threading.local()  # each taking thread's count at its last take
        self._closed = False
        self._pumping = threading.Thread(target=self._keep_pumping, name="compile-pool",
                                         daemon=True)
        self._pumping.start()

    @property
    def size(self) -> int:
        return len(self._procs)

    def _start(self, i: int) -> _Proc:
        spec = {**self._spec, "device": self._devices[i % len(self._devices)]} \
            if self._devices else self._spec
        entry, payload = "actors.compile_process:serve", json.dumps(spec)
        if self._forking:
            return _Proc(self._server.start(entry, payload), True, since=time.monotonic())
        return _Proc(child.start(entry, payload, stderr=self._stderr,
                                 env={**os.environ, **FORK_SAFE_ENV}), False,
                     since=time.monotonic())

    def set_limit(self, limit: CompileLimit) -> None:
        """The driver's limit, which compiles already running answer to from the next
        look at them."""
        self._given = limit
        self.limit = tighter(limit, self._learner.current)

    def started(self) -> bool:
        with self._lock:
            self._pump()
            return any(p is not None and p.ready for p in self._procs)

    def down(self) -> bool:
        return self._down is not None

    def finished_ms(self) -> list[float]:
        """How long each compile that ended well took (cache hits too), so far."""
        with self._lock:
            self._pump()
            return [c.compile_ms for c in self._done.values()
                    if c.ok and c.compile_ms is not None]

    def notices(self) -> list[str]:
        with self._lock:
            told, self._notices = self._notices, []
            return told

    def missed(self) -> None:
        """The stand-ins' binary was not the launch's (a geometry actors/meta_inputs.py got
        wrong, say): from now on the processes compile with real arguments, each setting
        CUDA up. Those running now start again, their configs first in the queue; those
        compiled and not yet taken are compiled again, as their launches would."""
        with self._lock:
            if self._spec.get("stand_ins") is False:
                return  # real arguments already: nothing left to fall back to
            self._spec["stand_ins"] = False
            self._notices.append("compile processes compile with real arguments from now "
                                 "on: a launch loaded another binary than theirs")
            for key in [k for k, c in self._done.items() if c.ok and k in self._configs]:
                del self._done[key]
                self._queue.append((key, self._configs[key]))
            for i, p in enumerate(self._procs):
                if p is None:
                    continue
                if p.task is not None:
                    self._queue.appendleft(p.task)
                    p.task = None
                child.kill(p.child)
                self._restart(i, "its stand-ins missed the launch's binary")

    def withdraw(self, key: int) -> bool:
        with self._lock:
            queued = [task for task in self._queue if task[0] == key]
            for task in queued:
                self._queue.remove(task)
            return bool(queued)

    def submit(self, key: int, config: Mapping[str, Any]) -> None:
        with self._lock:
            self._hints.pop(key, None)
            self._submitted.add(key)
            self._note_binary(key, config)
            if key not in self._done and not self._in_flight(key) \
                    and not self._rule_out(key, config):
                self._queue.append((key, config))
            self._pump()

    def hint(self, key: int, config: Mapping[str, Any]) -> None:
        with self._lock:
            if self._down is None and key not in self._done and not self._in_flight(key) \
                    and self._stopped.why(config) is None:
                self._note_binary(key, config)
                self._hints[key] = config
            self._pump()

    def _in_flight(self, key: int) -> bool:
        """Queued or compiling now (a hint is neither until a process takes it)."""
        return any(p is not None and p.task is not None and p.task[0] == key
                   for p in self._procs) or any(k == key for k, _ in self._queue)

    def take(self, keys: Iterable[int]) -> tuple[int, Compiled] | None:
        with self._lock:
            self._pump()
            self._seen.count = self._replies
            for key in keys:
                if key in self._done:
                    self._configs.pop(key, None)
                    return key, self._done.pop(key)
        return None

    def wait(self, timeout_s: float) -> None:
        """Until a reply was read since this thread's last take, or timeout_s. On a
        condition, which frees the lock meanwhile: a thread holding it across the wait
        would keep a submitting thread out (Python's locks are not fair) until its own
        result came, and the next batch would start compiling only then."""
        with self._news:
            if self._pumping.is_alive():
                if self._replies == getattr(self._seen, "count", self._replies):
                    self._news.wait(timeout_s)
                return
        self._wait_for_replies(timeout_s)  # none reads them but this thread (see below)

    def _wait_for_replies(self, timeout_s: float) -> None:
        with self._lock:
            replies = [p.child.replies for p in self._procs if p is not None]
        if not replies:  # the pool is down: nothing will come
            time.sleep(timeout_s)
            return
        with contextlib.suppress(OSError, ValueError):  # a process replaced meanwhile
            wait(replies, timeout=timeout_s)

    def _keep_pumping(self) -> None:
        """Read replies and hand out configs as they come, whatever its worker is doing:
        timing a config, or compiling one itself before any process was up (a process up
        then waited for the worker's next look: 0.9 s of 15 processes on an H200, results/
        heavy_compiles_meta_runs/matmul_empty.tar.gz). The worker's own takes pump too."""
        while True:
            with self._lock:
                if self._closed or self._down is not None:
                    return
                # Not ended by a failure: the processes it started on their own die with
                # it (their parent-death signal follows the thread that started them).
                with contextlib.suppress(OSError, ValueError, RuntimeError):
                    self._pump()
            self._wait_for_replies(PUMP_S)

    def _pump(self) -> None:
        """Take every reply that has arrived; hand queued configs to idle processes."""
        if self._read():
            self._replies += 1
            self._news.notify_all()
        self._hand_out()

    def _hand_out(self) -> None:
        for i, p in enumerate(self._procs):
            if p is not None and p.ready and p.task is None and (self._queue or self._hints):
                chosen = self._next_task()
                if chosen is None:  # each waits on a binary being compiled
                    break
                task, hinted = chosen
                p.task, p.since = task, time.monotonic()
                self._configs[task[0]] = task[1]  # until its result is taken
                trace.note("compile_sent", key=task[0], slot=i, hint=hinted)
                try:
                    p.child.requests.send(p.task)
                except OSError:  # it died while idle: the task was never its fault
                    self._queue.appendleft(p.task)
                    p.task = None
                    self._replace(i, "the compile process died")

    def _read(self) -> bool:
        """Take every reply that has arrived; whether there was any."""
        procs = [p for p in self._procs if p is not None]
        ready = wait([p.child.replies for p in procs], timeout=0)
        read = False
        for i, p in enumerate(self._procs):
            if p is None:
                continue
            if p.child.replies in ready:
                read = True
                try:
                    key, ms, error, binary = p.child.replies.recv()
                except EOFError:  # the compile process died (a crash inside the compiler)
                    if p.ready:
                        self._replace(i, "the compile process died")
                    else:
                        self._failed_start(i, "it exited while starting, without a word")
                    continue
                if key == "ready":
                    p.ready, self._failed_starts = True, 0
                    trace.note("compile_process_up", slot=i)
                elif key == "failed":
                    if p.task is not None:  # it was up, and lost its set-up: not the
                        self._queue.appendleft(p.task)  # config's doing, which goes on
                        p.task = None
                    self._failed_start(i, error)
                else:
                    self._done[key] = Compiled(ok=error is None, compile_ms=ms, error=error,
                                               binary=binary)
                    self._ended(key, ms)
                    p.task = None
                    trace.note("compile_done", key=key, ms=ms, ok=error is None)
                    if self._learner.add([ms]):
                        self.limit = tighter(self._given, self._learner.current)
            elif not p.ready and not p.forked and time.monotonic() - p.since > START_LIMIT_S:
                # (Not a fork: its clock would count the fork server's own imports.)
                self._failed_start(i, f"it was not up within {START_LIMIT_S:g} s")
            elif p.task is not None and time.monotonic() - p.since > self.limit.seconds:
                (key, config), limit = p.task, self.limit
                self._replace(i, limit.why(), True)
                if key in self._submitted and self._stopped.add(key, config, limit):
                    self._rule_out_queued()
        return read

    def _rule_out(self, key: int, config: Mapping[str, Any]) -> bool:
        """Whether config is at least as heavy as one a learnt limit stopped: then it ends
        as that limit's timeout, uncompiled (actors/compile_limit.py's Stopped)."""
        why = self._stopped.why(config)
        if why is not None:
            self._done[key] = Compiled(False, None, why, timed_out=True)
            trace.note("compile_ruled_out", key=key)
        return why is not None

    def _rule_out_queued(self) -> None:
        self._queue = deque(t for t in self._queue if not self._rule_out(*t))
        for key in [k for k, c in self._hints.items() if self._stopped.why(c) is not None]:
            del self._hints[key]

    def _failed_start(self, i: int, why: str) -> None:
        """A process that could not start. A fork's failure is the fork server's state (a
        kernel whose import set up CUDA there): from then on processes start on their own.
        Otherwise it is started again, up to MAX_FAILED_STARTS in a row; then its slot
        stays empty while other processes work, and with none up the pool is down: its
        worker compiles configs itself, as it does before the pool is up."""
        p = self._procs[i]
        assert p is not None
        why = why if len(why) <= NOTICE_CHARS else why[:NOTICE_CHARS - 1] + "…"
        child.kill(p.child)
        if p.forked and self._forking and self._unforked:
            self._forking = False
            self._notices.append(
                f"compile processes forked from one that imported the kernel cannot start "
                f"({why}); each starts on its own instead, importing torch and the kernel "
                "itself")
            for k, other in enumerate(self._procs):  # forks still starting will fail alike
                if other is not None and other.forked and not other.ready and k != i:
                    child.kill(other.child)
                    self._restart(k, why)
            self._restart(i, why)
            return
        self._failed_starts += 1
        if self._failed_starts < MAX_FAILED_STARTS and (self._unforked or not p.forked):
            self._restart(i, why)
            return
        self._procs[i] = None
        if not any(other is not None and other.ready for other in self._procs):
            self._go_down(why)  # else the others go on; this slot stays empty

    def _restart(self, i: int, why: str) -> None:
        """A new process in slot i; one that cannot even be started (no processes or
        memory left) counts as a failed start."""
        try:
            self._procs[i] = self._start(i)
        except OSError as e:
            self._procs[i] = None
            self._failed_starts += 1
            if not any(p is not None for p in self._procs):
                self._go_down(f"{why}; then {e.strerror or e}")

    def _go_down(self, why: str) -> None:
        """No process can start: the pool stays down, and what its processes were
        compiling goes back to the queue, which its worker compiles from itself."""
        self._down = why
        self._notices.append(f"compile processes cannot start ({why}); this worker compiles "
                             "each config itself before timing it")
        for k, other in enumerate(self._procs):
            if other is not None:
                if other.task is not None:
                    self._queue.appendleft(other.task)
                child.kill(other.child)
            self._procs[k] = None
        self._hints.clear()

    def _next_task(self) -> tuple[tuple[int, Mapping[str, Any]], bool] | None:
        """The first queued config, else the oldest hint (the sweep hands configs out in
        order), whose binary no process is compiling (see the module's docstring); and
        whether it was a hint."""
        busy = {self._binaries[p.task[0]] for p in self._procs if p is not None
                and p.task is not None and p.task[0] in self._binaries} - self._unshared
        for k, task in enumerate(self._queue):
            if not busy or self._binaries.get(task[0]) not in busy:
                del self._queue[k]
                return task, False
        for key, config in self._hints.items():
            if not busy or self._binaries.get(key) not in busy:
                del self._hints[key]
                return (key, config), True
        return None

    def _note_binary(self, key: int, config: Mapping[str, Any]) -> None:
        """What decides a config's binary besides the integer sizes of its problem: its
        kernel config, and any problem key that is not an integer (a dtype, a kernel's
        name in a sweep of several)."""
        if self._keys and key not in self._binaries:
            self._binaries[key] = canonical_json({
                k: v for k, v in config.items() if k not in self._keys
                or not isinstance(v, int) or isinstance(v, bool)})

    def _ended(self, key: int, ms: float) -> None:
        """A compile ended: a second of its binary that found no cached one shows its
        problems do not share it."""
        binary = self._binaries.get(key)
        if binary is None:
            return
        if binary in self._built and ms >= CACHE_HIT_MS:
            self._unshared.add(binary)
        self._built.add(binary)

    def _replace(self, i: int, why: str, timed_out: bool = False) -> None:
        p = self._procs[i]
        assert p is not None
        if p.task is not None:
            key = p.task[0]
            trace.note("compile_killed", key=key, why=why)
            if not timed_out and key not in self._retried:
                # A death may not be this config's doing (the process may have died
                # before reading it): one more try before the config takes the blame.
                self._retried.add(key)
                self._queue.appendleft(p.task)
            else:
                ms = (time.monotonic() - p.since) * 1e3
                self._done[key] = Compiled(False, ms, why, timed_out=timed_out)
                self._unshared.add(self._binaries.get(key, ""))
        child.kill(p.child)
        self._restart(i, why)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            # Their pids first (a server still importing has forked none), so that each
            # process is killed with its group: the compilers it runs go too.
            self._server.settle(1.0)
            for p in self._procs:
                if p is not None:
                    child.kill(p.child)
            self._server.close()
