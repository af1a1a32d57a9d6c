"""The local runtime: each worker a plain process of this machine (actors/worker_host.py),
its messages read from a pipe; no Ray to start or stop. The default on one machine
(sweep/engines/local_engine.py).

Each worker has two threads here: one sends its requests and one reads its messages whole
onto a queue the driver polls, so the driver never blocks on the pipe of a worker that
stopped reading or froze mid-message. A worker's process ending shows as the end of its
pipe, after every message it sent: the loss is reported after them, with how the process
ended (killed by SIGKILL, exit code 1), so a dead worker takes the same WorkerLost path as
a Ray actor's death.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from actors import child
from actors.launcher import LAUNCHER_ENV
from actors.protocol import (
    Batch,
    CompileLimit,
    Finished,
    Retimed,
    WorkerSettings,
)
from sweep.engines.runtime import (
    BatchDone,
    Event,
    Placement,
    RetimeAbandoned,
    Trial,
    WorkerLost,
    WorkerUp,
    event_of,
)

_EOF = ("eof",)  # what a worker's reader queues once its pipe has ended


@dataclass
class _Worker:
    name: str
    child: child.Child
    requests: queue.SimpleQueue[bytes | None]
    gpu: str | None
    streams: dict[int, int] = field(default_factory=dict)  # batch -> trials not reported
    why: str | None = None  # set once it is reported lost
    # Answers to re-timing requests, by request number (one abandoned may answer late).
    retimed: queue.SimpleQueue[tuple[int, str, Any]] = field(default_factory=queue.SimpleQueue)


def _pickled(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class LocalRuntime:
    def __init__(self, settings: WorkerSettings, placement: Placement,
                 gpus: Mapping[str, str] | None = None, log: Path | None = None) -> None:
        """gpus: GPU id -> type, for workers that take a GPU each (placement.num_gpus);
        log: where the workers' output goes (the terminal's stderr without one)."""
        self.settings = settings
        self.placement = placement
        self._types = dict(gpus or {})
        self._free = dict(self._types)  # not held by a worker
        self._log: IO[bytes] | None = open(log, "ab") if log else None  # noqa: SIM115
        self._workers: dict[str, _Worker] = {}
        self._adopted: set[str] = set()  # launchers begun early, given to a worker
        # (worker state, message) from every worker's reader, in arrival order
        self._inbox: queue.SimpleQueue[tuple[_Worker, tuple[Any, ...]]] = queue.SimpleQueue()
        self._pending: list[Event] = []  # read for another worker while settling one
        self._lock = threading.Lock()  # _pending, with re-timing on several threads
        self._serial = itertools.count()
        self._settings = _pickled(settings)

    # --- workers ---------------------------------------------------------------------------
    def start(self, worker: str, kind: str = "") -> None:
        env = {**os.environ, **self.placement.env}
        gpu = None
        if self.placement.num_gpus:
            gpu = next((g for g, t in self._free.items() if not kind or t == kind), None)
            if gpu is None:
                with self._lock:
                    self._pending.append(WorkerLost(worker, "no GPU of this machine is free "
                                                            "for it", init_failed=True))
                return
            env["CUDA_VISIBLE_DEVICES"] = gpu
        else:  # a launcher begun early for the interpreter's worker (sweep/engines/prestart.py)
            key = next((k for k in self.settings.prestarted if k.startswith("cpu")
                        and k not in self._adopted), None)
            if key is not None:
                self._adopted.add(key)
                env[LAUNCHER_ENV] = key
        process = child.start("actors.worker_host:serve", "", env=env, stderr=self._log)
        if gpu is not None:
            del self._free[gpu]
        requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        state = _Worker(worker, process, requests, gpu)
        self._workers[worker] = state
        threading.Thread(target=_send, args=(process.requests, requests),
                         name=f"to-{worker}", daemon=True).start()
        threading.Thread(target=_receive, args=(state, self._inbox),
                         name=f"from-{worker}", daemon=True).start()
        requests.put(self._settings)
        requests.put(_pickled((worker, kind)))

    def submit(self, worker: str, batch: int, trials: Sequence[Trial],
               ahead: Sequence[tuple[int, dict[str, Any]]],
               limit: CompileLimit | None = None) -> None:
        state = self._workers[worker]
        state.streams[batch] = len(trials)
        state.requests.put(_pickled(("run", Batch(batch, list(trials), list(ahead), limit))))

    def set_limit(self, worker: str, limit: CompileLimit) -> None:
        self._workers[worker].requests.put(_pickled(("limit", limit)))

    def kill(self, worker: str) -> None:
        state = self._workers.pop(worker, None)
        if state is None:
            return
        state.requests.put(None)  # its sender closes the request pipe, its reader the other
        child.kill_process(state.child.process)
        if state.gpu is not None:
            self._free[state.gpu] = self._types[state.gpu]

    # --- events ----------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> list[Event]:
        with self._lock:
            events, self._pending = self._pending, []
        if events:
            return events
        try:
            got = [self._inbox.get(timeout=timeout_s) if timeout_s > 0
                   else self._inbox.get_nowait()]
        except queue.Empty:
            return []
        while True:
            try:
                got.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        return [e for state, message in got for e in self._events_of(state, message)]

    def _events_of(self, state: _Worker, message: tuple[Any, ...]) -> list[Event]:
        if self._workers.get(state.name) is not state or state.why is not None:
            return []  # killed, or lost: nothing of it is reported afterwards
        tag, name = message[0], state.name
        if tag == "msgs":
            batch = message[1]
            out: list[Event] = []
            for m in message[2]:
                if isinstance(m, Finished):
                    state.streams[batch] = state.streams.get(batch, 0) - len(m.records)
                out.append(event_of(name, batch, m))
            return out
        if tag == "end":
            state.streams.pop(message[1], None)
            return [BatchDone(name, message[1])]
        if tag == "up":
            info = message[1]
            return [WorkerUp(name, info["device"], info["node"], info.get("versions", {}))]
        if tag == "init_failed":
            return [self._lost(state, f"its start-up raised {message[1]}", init_failed=True)]
        if tag == "failed":
            return [self._lost(state, message[2])]
        assert message is _EOF, message
        return [self._lost(state, _ended(state))]

    def _lost(self, state: _Worker, why: str, init_failed: bool = False) -> WorkerLost:
        state.why = why
        state.retimed.put((-1, "lost", why))  # wakes a re-timing that waits on it
        return WorkerLost(state.name, why, init_failed)

    def settle(self, worker: str, timeout_s: float) -> list[Event]:
        """This worker's events; another's read meanwhile wait for the next poll()."""
        state = self._workers.get(worker)
        if state is None:
            return []
        deadline = time.monotonic() + timeout_s
        events: list[Event] = []
        while state.why is None:
            left = deadline - time.monotonic()
            # Waited for while its streams are unfinished; otherwise what has arrived.
            wait = left > 0 and any(n > 0 for n in state.streams.values())
            try:
                other, message = self._inbox.get(timeout=left) if wait \
                    else self._inbox.get_nowait()
            except queue.Empty:
                break
            got = self._events_of(other, message)
            if other is state:
                events += got
            else:
                with self._lock:
                    self._pending += got
        return events

    # --- re-timing -------------------------------------------------------------------------
    def retime(self, worker: str, configs: Sequence[dict[str, Any]], rounds: int,
               timeout_s: float, should_stop: Callable[[], bool]) -> Retimed:
        state = self._workers[worker]
        number = next(self._serial)
        state.requests.put(_pickled(("retime", number, list(configs), rounds)))
        deadline = time.monotonic() + timeout_s
        while True:
            if state.why is not None:
                raise RetimeAbandoned(f"worker {worker} was lost while re-timing: {state.why}")
            if should_stop():
                raise RetimeAbandoned("stopped while re-timing")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RetimeAbandoned(f"no answer within {timeout_s:g} s")
            self._take_events()  # a death shows in the events: read them meanwhile
            try:
                answered, tag, result = state.retimed.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue
            if answered != number:
                continue  # a loss (checked above), or an abandoned request's late answer
            if tag != "retimed":
                raise RetimeAbandoned(f"worker {worker} failed while re-timing: {result}")
            assert isinstance(result, Retimed)
            return result

    def _take_events(self) -> None:
        """What has arrived, kept for the next poll() (re-timing reads no events itself)."""
        events = []
        while True:
            try:
                state, message = self._inbox.get_nowait()
            except queue.Empty:
                break
            events += self._events_of(state, message)
        if events:
            with self._lock:
                self._pending += events

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def close(self) -> None:
        for worker in list(self._workers):
            self.kill(worker)
        if self._log is not None:
            self._log.close()
            self._log = None


def _ended(state: _Worker) -> str:
    pid = state.child.process.pid
    try:
        how = state.child.exit_text()
    except Exception:  # not reaped in time: it closed its pipe
        return f"its process (pid {pid}) closed its pipe"
    return f"its process (pid {pid}) ended ({how})"


def _send(connection: Connection, requests: queue.SimpleQueue[bytes | None]) -> None:
    try:
        while (data := requests.get()) is not None:
            connection.send_bytes(data)
    except Exception:  # it is gone: its reader reports how
        pass
    finally:
        connection.close()


def _receive(state: _Worker, inbox: queue.SimpleQueue[tuple[_Worker, tuple[Any, ...]]]
             ) -> None:
    """Each message whole onto the inbox; then the pipe's end. Re-timing answers go to
    the worker's own queue."""
    connection = state.child.replies
    try:
        while True:
            message = pickle.loads(connection.recv_bytes())
            if message[0] in ("retimed", "retime_failed"):
                state.retimed.put((message[1], message[0], message[2]))
            else:
                inbox.put((state, message))
    except Exception:  # EOF, or a message it could not finish
        inbox.put((state, _EOF))
    finally:
        connection.close()
