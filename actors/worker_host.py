"""A trial worker as a plain process of this machine: the local runtime's worker
(sweep/engines/local_runtime.py), the same TrialWorker a Ray actor runs, served over two pipes.

The driver sends requests; the worker answers with tagged messages, one pickle each, from
whichever of its threads has them (a thread per batch it holds, as a Ray actor has):
  ("up", info) once it can run a trial, or ("init_failed", why) if it cannot;
  ("msgs", batch, [WorkerMessage, ...]), then ("end", batch), or ("failed", batch, why);
  ("retimed", request, Retimed) or ("retime_failed", request, why).
Requests are served on a pool of threads that live as long as the process: a process a
worker starts (its kernel launcher, a compile process) dies when the thread that started
it ends (PR_SET_PDEATHSIG).
Its stdout and stderr (a kernel's prints, Triton's warnings) go where the driver pointed
its stderr, never to the user's terminal. It dies with the driver (PR_SET_PDEATHSIG, and
at the latest when its request pipe closes).
"""

from __future__ import annotations

import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from actors import child
from actors.child import error_line
from actors.protocol import Batch, WorkerSettings
from actors.worker import TrialWorker, WorkerError

# Threads serving requests: a batch holds one until its every trial is reported, and the
# driver keeps a few batches in flight per worker, besides info() and re-timing.
THREADS = 16


class _Outbox:
    """The reply pipe, shared by the worker's threads: one message at a time."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            try:
                self._connection.send_bytes(data)
            except OSError:  # the driver is gone: so is this worker
                os._exit(0)


def serve(read_fd: int, write_fd: int, payload: str) -> None:
    os.dup2(2, 1)  # what the kernel prints goes to the worker's log, not the summary
    inbox, connection = child.connect(read_fd, write_fd)
    outbox = _Outbox(connection)
    try:
        settings = inbox.recv()
        name, kind = inbox.recv()
        assert isinstance(settings, WorkerSettings)
        worker = TrialWorker(settings, name, kind)
    except EOFError:
        os._exit(0)
    except BaseException as e:  # the constructor's failure is the driver's to report
        outbox.send(("init_failed", error_line(e)))
        os._exit(1)
    # Batches are taken while the device and its launcher come up: the compile pool
    # begins on them at once. Never shut down: the process ends with os._exit.
    threads = ThreadPoolExecutor(THREADS, thread_name_prefix="request")
    threads.submit(_up, worker, outbox)
    while True:
        try:
            request = inbox.recv()
        except (EOFError, OSError):
            os._exit(0)
        op = request[0]
        if op == "run":
            threads.submit(_run, worker, request[1], outbox)
        elif op == "limit":
            worker.set_limit(request[1])
        elif op == "retime":
            threads.submit(_retime, worker, request[1], request[2], request[3], outbox)


def _up(worker: TrialWorker, outbox: _Outbox) -> None:
    try:
        info = worker.info()
    except BaseException as e:
        outbox.send(("init_failed", error_line(e)))
        os._exit(1)
    outbox.send(("up", info))


def _run(worker: TrialWorker, batch: Batch, outbox: _Outbox) -> None:
    try:
        for messages in worker.run(batch):
            outbox.send(("msgs", batch.number, messages))
    except WorkerError as e:
        outbox.send(("failed", batch.number, f"it raised {e}"))
        return
    except BaseException as e:
        outbox.send(("failed", batch.number, f"it raised {error_line(e)}"))
        return
    outbox.send(("end", batch.number))


def _retime(worker: TrialWorker, number: int, configs: list[dict[str, Any]], rounds: int,
            outbox: _Outbox) -> None:
    try:
        result = worker.retime(configs, rounds)
    except BaseException as e:
        outbox.send(("retime_failed", number, error_line(e)))
        return
    outbox.send(("retimed", number, result))
