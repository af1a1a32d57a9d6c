"""Work a local GPU run begins before Ray is up.

Starting Ray takes seconds (5-9 s on an H200 host), and so does each worker's own start
(importing torch, setting up CUDA: 7 s more there; BENCHMARKS.md). Neither needs the
other, and neither does compiling. So a run that starts its own Ray on a machine with GPUs
first starts, on this machine, one kernel launcher per GPU (the process a worker times
kernels in) and a compile pool that fills Triton's on-disk cache with the configs handed
out first. Each worker then adopts its GPU's launcher instead of starting one
(actors/launcher.py), and its own compile pool finds those configs compiled. The early
pool stops once a worker's own pool is up (its first config compiled ahead): from then on
the workers' pools have the CPUs. Until then a worker compiles in its launcher, mostly
finding the early pool's work in the cache.

On the local runtime the workers start as soon as the kernel is imported here, so there
is no wait to fill: instead of early compiles, a fork server (actors/child.py's
serve_prepared) imports torch, Triton and the kernel from the first second, and each
worker's compile pool forks its processes from it (FORKS), with no imports of its own: on
an H200 host a worker's own fork server took 22 s to import Liger-Kernel beside the run's
other imports, while the early pool's compiles it replaced were killed at the hand-over.

Nothing here changes what a run records: a launcher that is not adopted, or a compile
that did not finish, is only time not saved. The early pool's processes are spread over
the GPUs (each sets up CUDA), and what any of these processes print goes to a log in their
temporary directory, not to the user's terminal.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from actors import child, spares, trace
from actors.compile_pool import FORK_SAFE_ENV, CompileJob, CompilePool
from actors.protocol import FORKS, CompileLimit, WorkerSettings
from actors.worker import launcher_payload
from sweep.engines.machine import visible_gpus

# Configs given to the early pool, per compile process: more than it gets through while Ray
# starts (seconds; a compile takes about half a second); the workers' pools do the rest.
EARLY_PER_PROCESS = 32
POOL_CAP = 512  # compile processes, at most: a bound on the configs taken from the order
PRESTART_ENV = "SWEEP_PRESTART"  # "0": no work begun early (to measure without it)


def ahead(argv: Sequence[str]) -> None:
    """`sweep run`'s first step, before it imports the rest of itself: where this machine
    has GPUs and the command line leaves a local GPU run possible, it starts a spare
    interpreter (actors/spares.py) for each GPU's launcher and one for the fork server,
    each with the environment that process will have. The session ends those the early
    start did not take as soon as it has begun it (a spec of another backend, a run on
    Ray, which starts no fork server), and the command ends them where it ends before
    (a cached answer, a bad spec)."""
    if not argv or argv[0] != "run" or os.environ.get(PRESTART_ENV) == "0" or \
            os.environ.get("RAY_ADDRESS") or any(
                a in ("-h", "--help") or a.startswith("--address") for a in argv):
        return
    backend = next((b for a, b in itertools.pairwise(argv) if a == "--backend"), None) or next(
        (a.partition("=")[2] for a in argv if a.startswith("--backend=")), None)
    gpus = visible_gpus()
    if backend in (None, "auto", "cuda") and gpus:
        spares.start([_environment(extra) for extra in _launcher_envs(gpus).values()]
                     + [_environment(FORK_SAFE_ENV)])


def _launcher_envs(gpus: Iterable[str]) -> dict[str, dict[str, str]]:
    """What each GPU's launcher adds to this process's environment."""
    return {gpu: {"CUDA_VISIBLE_DEVICES": gpu} for gpu in gpus}


def _environment(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}


@dataclass
class Prestart:
    # GPU id (or cpuN, a launcher for the interpreter's Nth worker) -> (socket, key, pid)
    launchers: dict[str, tuple[str, str, int]]
    processes: list[subprocess.Popen]
    pool: CompilePool | None
    directory: Path
    log: IO[bytes]
    backend: str = "cuda"

    @classmethod
    def begin(cls, settings: WorkerSettings, configs: Iterable[tuple[int, dict[str, Any]]],
              adopted_pools: bool = False) -> Prestart | None:
        """settings: as the workers will get them, but for the problem, which may be the
        spec's as written; configs: the first to be handed out, in order; adopted_pools:
        the workers' pools fork from a server begun here (the local runtime's), and
        nothing compiles early. Call from a thread that outlives the run: the processes
        die with the thread that started them."""
        gpus = visible_gpus()
        if not gpus:
            return None
        directory, log, launchers, processes = _launchers(settings, _launcher_envs(gpus))
        if adopted_pools:
            launchers[FORKS] = _fork_server(directory, log, settings, processes)
            return cls(launchers, processes, None, directory, log)
        first = list(itertools.islice(configs, EARLY_PER_PROCESS * POOL_CAP))
        if not first:  # a search: nothing to compile early
            return cls(launchers, processes, None, directory, log)
        # The CPUs Ray and the launchers leave, spread over the GPUs (for a process that
        # sets up CUDA); compiles run niced below the launchers.
        size = max(1, (os.cpu_count() or 2) - 1 - len(gpus))
        pool = CompilePool(size, CompileJob.of(settings), CompileLimit(settings.compile_timeout_s),
                           devices=gpus, stderr=log, unforked=False,
                           adaptive=settings.compile_limit_auto)
        for index, config in first[:EARLY_PER_PROCESS * size]:
            pool.submit(index, config)
        return cls(launchers, processes, pool, directory, log)

    @classmethod
    def begin_interpret(cls, settings: WorkerSettings, workers: int) -> Prestart:
        """A launcher for each of the interpreter's first workers (the local runtime's,
        which adopt them by actors.launcher.LAUNCHER_ENV): each imports torch, Triton and
        the kernel while this process imports the kernel too. No compiles: the
        interpreter has none."""
        env = {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
        directory, log, launchers, processes = _launchers(
            settings, {f"cpu{k}": env for k in range(workers)})
        return cls(launchers, processes, None, directory, log, backend="interpret")

    def stop_compiling(self) -> list[float]:
        """Ends the early compiles; returns how long each that ended took (ms): real
        compiles, where the workers then mostly find the binaries in Triton's cache."""
        if self.pool is None:
            return []
        trace.note("early_pool_stopped")
        try:
            took = self.pool.finished_ms()
        except (OSError, ValueError, RuntimeError):
            took = []
        self.pool.close()
        self.pool = None
        return took

    def close(self, keep_log: Path | None = None) -> None:
        """Everything it started ends: adopted launchers die with their workers anyway.
        keep_log: where what its processes printed is appended (the run's workers.log)."""
        self.stop_compiling()
        for process in self.processes:
            # Not awaited: a process with a CUDA context takes a moment to end, which the
            # command need not wait for (each is reaped by its own thread).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        self.log.close()
        if keep_log is not None:
            with contextlib.suppress(OSError):
                said = (self.directory / "stderr.log").read_bytes()
                if said:
                    with keep_log.open("ab") as f:
                        f.write(said)
        _release(self.directory)


PREFIX = "sweep-prestart-"
OWNER = ".owner"  # locked by the command that made the folder for as long as it runs


def _own_directory() -> Path:
    """A temporary folder of this command's, named with its pid and held by a lock that
    ends with the process however it ends; those of commands that are gone (killed, say)
    are removed first: nobody else would."""
    root = Path(tempfile.gettempdir())
    for stale in root.glob(f"{PREFIX}*-*"):
        if _abandoned(stale):
            shutil.rmtree(stale, ignore_errors=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    held = os.open(directory / OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    _HELD[directory] = held
    return directory


_HELD: dict[Path, int] = {}  # this process's folders: the lock's file, open till close()


def _abandoned(folder: Path) -> bool:
    """Whether the command that made folder is gone: the pid its name carries runs no more
    and its lock is free. A free lock alone is not enough: a command starting this very
    moment has made its folder but not yet taken its lock."""
    pid = folder.name[len(PREFIX):].partition("-")[0]
    if not pid.isdigit() or child.alive(int(pid)):
        return False
    try:
        held = os.open(folder / OWNER, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True  # it died before its lock
    except OSError:
        return False  # another user's, or not a folder: not ours to judge
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(held)


def _release(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    held = _HELD.pop(directory, None)
    if held is not None:
        os.close(held)


def _fork_server(directory: Path, log: IO[bytes], settings: WorkerSettings,
                 processes: list[subprocess.Popen]) -> tuple[str, str, int]:
    """A prepared fork server for the workers' compile pools: (socket, key, pid)."""
    address, key = str(directory / "forks"), secrets.token_hex(child.KEY_BYTES)
    trace.note("fork_server_started")
    payload = json.dumps({"kernel": settings.kernel, "kernel_path": settings.kernel_path,
                          "problem": dict(settings.problem), "seed": settings.seed})
    process = _start("actors.child:serve_prepared", address, key,
                     "actors.compile_process:prepare", payload,
                     env=_environment(FORK_SAFE_ENV), log=log)
    threading.Thread(target=process.wait, daemon=True).start()
    processes.append(process)
    return address, key, process.pid


def _launchers(settings: WorkerSettings, env: dict[str, dict[str, str]]
               ) -> tuple[Path, IO[bytes], dict[str, tuple[str, str, int]],
                          list[subprocess.Popen]]:
    """A launcher started for each key, with that key's environment."""
    directory = _own_directory()
    # What these processes print (a kernel that fails to import, say) goes here: the run
    # reports a bad spec in one line of its own.
    log = open(directory / "stderr.log", "ab")  # noqa: SIM115 - closed in close()
    launchers: dict[str, tuple[str, str, int]] = {}
    processes: list[subprocess.Popen] = []
    for name, extra in env.items():
        address, key = str(directory / f"launcher-{len(processes)}"), secrets.token_hex(16)
        process = _start("actors.launcher:serve_prestarted", address, key,
                         launcher_payload(settings), env=_environment(extra), log=log)
        # Reaped as soon as it ends, so that a worker sees it gone, not a zombie.
        threading.Thread(target=process.wait, daemon=True).start()
        processes.append(process)
        launchers[name] = (address, key, process.pid)
    return directory, log, launchers, processes


def _start(entry: str, *args: str, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
    """entry run in a spare begun for this environment, or else in a fresh process."""
    return spares.become(entry, *args, env=env, out=log.name) or child.start_detached(
        entry, *args, env=env, stderr=log, stdout=log)
