"""The Runtime on Ray: one actor per worker, one streaming generator per batch.

Each batch is a call of TrialWorker.run, a Ray generator, so records stream back as trials
finish (in lists: the messages a worker had ready at once). An actor's death surfaces as
an error on whichever of its calls the driver reads next; before reporting it, every
message the worker managed to send is taken, so results that arrived are never lost with
it.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)

from actors.child import error_line
from actors.protocol import (
    Batch,
    CompileLimit,
    Finished,
    Retimed,
    WorkerMessage,
    WorkerSettings,
)
from actors.worker import TrialWorker, WorkerError
from sweep.engines.runtime import (
    BatchDone,
    ClusterLost,
    Event,
    Placement,
    RetimeAbandoned,
    Trial,
    WorkerLost,
    WorkerUp,
    event_of,
)

TYPE_RESOURCE = "accelerator_type:"


# How long the GCS may not answer before the cluster counts as lost: well within the 60 s
# after which Ray ends the process, with time left for a clean stop.
GCS_GRACE_S = 10.0
GCS_PROBE_EVERY_S = 1.0


class GcsWatch:
    """Whether the head's GCS still answers: a TCP connect to its port, at most once a
    GCS_PROBE_EVERY_S (refused at once when the head's processes are gone, a timeout when
    its host is). No Ray call: Ray's own GCS client queues requests while the GCS is away
    (and ends the process once it has been away gcs_rpc_server_reconnect_timeout_s), and
    actors already placed keep streaming results meanwhile, so nothing else notices."""

    def __init__(self, address: str, grace_s: float = GCS_GRACE_S) -> None:
        host, _, port = address.rpartition(":")
        self.where = (host.strip("[]"), int(port))
        self.grace_s = grace_s
        self.last_ok = self.last_probe = time.monotonic()
        self.gone: str | None = None  # why the cluster counts as lost, once it does

    def check(self) -> None:
        if self.gone is not None:  # lost stays lost, even between two probes
            raise ClusterLost(self.gone)
        now = time.monotonic()
        if now - self.last_probe < GCS_PROBE_EVERY_S:
            return
        self.last_probe = now
        try:
            # Short: a head whose host stops answering costs the loop this much a second.
            with socket.create_connection(self.where, timeout=0.3):
                self.last_ok = time.monotonic()
                return
        except OSError as e:
            why = e.strerror or type(e).__name__
        away = time.monotonic() - self.last_ok
        if away >= self.grace_s:
            raise self.give_up(f"its GCS has not answered for {away:.0f} s ({why})")

    def give_up(self, why: str) -> ClusterLost:
        """The cluster counts as lost from now on, for this reason."""
        self.gone = f"the Ray cluster (its head at {self.where[0]}:{self.where[1]}) was " \
                    f"lost: {why}"
        return ClusterLost(self.gone)


# A worker's start waits on the GCS (the actor's registration; the class's export, once),
# which Ray's client retries for 60 s when the GCS is gone, and then ends the process: a
# start runs on a thread while the head is watched. A GCS that still accepts connections but
# has not registered the worker in this long is wedged, and as good as lost (long enough
# for a first export and a runtime environment's set-up on a loaded machine).
START_ANSWER_S = 120.0


class _Creation:
    """An actor's creation (its handle and its info() call) on a daemon thread: one stuck
    in Ray's GCS client must not hold up the interpreter's exit. One given up is killed if
    it completes after all."""

    def __init__(self, create: Callable[[], Any]) -> None:
        self._create = create
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._abandoned = False
        self.made: tuple[Any, Any] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="actor-start", daemon=True).start()

    def _run(self) -> None:
        try:
            handle = self._create()
            self.made = (handle, handle.info.remote())
        except BaseException as e:  # handed to the waiting thread
            self.error = e
        with self._lock:
            self.done.set()
            late = self._abandoned
        if late and self.made is not None:
            with contextlib.suppress(RayError):
                ray.kill(self.made[0], no_restart=True)

    def abandon(self) -> bool:
        """Give it up; False if it had completed (its result is then the caller's)."""
        with self._lock:
            self._abandoned = not self.done.is_set()
            return self._abandoned


# Parts of Ray's report of a dead actor: why it died, and for a dead process how it ended
# (before Ray's generic advice begins).
_BECAUSE = re.compile(r"The actor (?:died|is dead) because (.+?)(?:\.\s|\.$|$)", re.S)
_EXIT_DETAIL = re.compile(r"Worker exit detail: (.*?)(?: Some common causes| There are some "
                          r"potential root causes| If the process|$)", re.S)
_PID = re.compile(r"\bpid: (\d+)")
_IP = re.compile(r"\bip: (\S+)")
WHY_CHARS = 300


def why_dead(e: RayError) -> str:
    """Ray's report of a failed or dead worker in one line of the sweep's own: what the
    worker raised, or how its process ended. Ray's own reports run to a thousand
    characters over several lines, most of it generic advice."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, WorkerError):
        return _line(f"it raised {cause}")
    if isinstance(e, RayTaskError) and isinstance(cause, BaseException) and \
            not isinstance(cause, RayError):
        return _line(f"it raised {error_line(cause)}")
    text = getattr(e, "error_msg", None) or str(e)
    if isinstance(e, ActorUnavailableError):  # its process or node stopped answering
        rpc = re.search(r"(RpcError: .*?)(?:\. The task|$)", text, re.S)
        return _line("its process stopped answering (its node lost, or the process gone"
                     + (f"; {rpc.group(1)})" if rpc else ")"))
    if isinstance(e, RayActorError) and e.actor_init_failed:
        raised = [line.strip() for line in text.splitlines()
                  if re.match(r"\s*[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", line)]
        return _line(f"its start-up raised {raised[-1]}" if raised else text)
    detail = _EXIT_DETAIL.search(text)
    if detail:
        pid = _PID.search(text)
        of = f" (pid {pid.group(1)})" if pid else ""
        said = " ".join(detail.group(1).split())
        if "connection error code 2" in said or "End of file" in said:
            return (f"its process{of} ended without a word (a crash, a signal, os._exit or "
                    "the OOM killer)")
        return _line(f"its process{of} died: {said}")
    because = _BECAUSE.search(text)
    if because:
        ip = _IP.search(text)
        said = " ".join(because.group(1).split())
        if ip and "node" in said:
            said = said.replace("its node", f"its node ({ip.group(1)})", 1)
        return _line(said)
    return _line(text)


def _line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= WHY_CHARS else text[:WHY_CHARS - 1] + "…"


@dataclass
class _Stream:
    batch: int
    trials: int
    gen: Any  # ray ObjectRefGenerator
    reported: int = 0


@dataclass
class _Actor:
    handle: Any
    ready: Any  # its info() call; answers once the worker is up
    streams: list[_Stream] = field(default_factory=list)


class RayRuntime:
    def __init__(self, settings: WorkerSettings, placement: Placement, batches: int,
                 typed: Collection[str] = ()) -> None:
        """batches: the most a worker holds at once (Limits.max_batches). typed: the
        device types the cluster's nodes are labelled with (see placement.device_types)."""
        self.settings = settings
        self.placement = placement
        self.batches = batches
        self.typed = set(typed)
        self._actors: dict[str, _Actor] = {}
        self._watch: GcsWatch | None = None
        self._class: Any = None  # TrialWorker as a Ray actor class

    def start(self, worker: str, kind: str = "") -> None:
        p = self.placement
        # A thread for each batch the worker holds (see actors/worker.py), and one for
        # info() and retime().
        options: dict[str, Any] = {"num_cpus": p.num_cpus, "num_gpus": p.num_gpus,
                                   "max_restarts": 0, "max_task_retries": 0,
                                   "max_concurrency": self.batches + 1}
        resources = dict(p.resources)
        if kind and kind in self.typed:
            # Ray gives each node with GPUs a resource naming their type, amount 1.
            resources[TYPE_RESOURCE + kind] = 0.001
        if resources:
            options["resources"] = resources
        if p.env:
            options["runtime_env"] = {"env_vars": dict(p.env)}
        if self._class is None:  # one class: exported to the GCS once, not at every start
            self._class = ray.remote(TrialWorker)
        actor_class = self._class
        creation = _Creation(lambda: actor_class.options(**options).remote(
            self.settings, worker, kind))
        deadline = time.monotonic() + START_ANSWER_S
        try:
            while not creation.done.wait(0.1):
                watch = self._check_head()  # ClusterLost once the head is away GCS_GRACE_S
                if time.monotonic() >= deadline:
                    raise watch.give_up(f"its GCS did not register worker {worker} within "
                                        f"{START_ANSWER_S:g} s")
        except BaseException:
            if not creation.abandon() and creation.made is not None:
                self._actors[worker] = _Actor(*creation.made)  # close() stops it
            raise
        if creation.error is not None:
            raise creation.error
        assert creation.made is not None
        self._actors[worker] = _Actor(*creation.made)

    def submit(self, worker: str, batch: int, trials: Sequence[Trial],
               ahead: Sequence[tuple[int, dict[str, Any]]],
               limit: CompileLimit | None = None) -> None:
        actor = self._actors[worker]
        gen = actor.handle.run.remote(Batch(batch, list(trials), list(ahead), limit))
        actor.streams.append(_Stream(batch, len(trials), gen))

    def set_limit(self, worker: str, limit: CompileLimit) -> None:
        self._actors[worker].handle.set_limit.remote(limit)  # an answer is not awaited

    def _check_head(self) -> GcsWatch:
        """Raises ClusterLost once the head has been away GCS_GRACE_S."""
        if self._watch is None:
            self._watch = GcsWatch(ray.get_runtime_context().gcs_address)
        self._watch.check()
        return self._watch

    def poll(self, timeout_s: float) -> list[Event]:
        self._check_head()
        refs: dict[Any, tuple[str, _Stream | None]] = {}
        for name, actor in self._actors.items():
            if actor.ready is not None:
                refs[actor.ready] = (name, None)
            for stream in actor.streams:
                refs[stream.gen] = (name, stream)
        if not refs:
            time.sleep(timeout_s)  # nothing to wait on: a worker may be started later
            return []
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout_s)
        if not ready:
            return []
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        events: list[Event] = []
        for ref in ready:
            name, maybe_stream = refs[ref]
            if name not in self._actors:
                continue  # lost while handling an earlier ref of this round
            if maybe_stream is None:
                events += self._answer_ready(name)
            elif maybe_stream in self._actors[name].streams:
                events += self._take(name, maybe_stream)
        return events

    def _answer_ready(self, name: str) -> list[Event]:
        actor = self._actors[name]
        try:
            info = ray.get(actor.ready)
        except RayActorError as e:
            return self._lost(name, why_dead(e), e.actor_init_failed)
        except RayError as e:
            return self._lost(name, why_dead(e), True)
        actor.ready = None
        return [WorkerUp(name, info["device"], info["node"], info.get("versions", {}))]

    def _take(self, name: str, stream: _Stream) -> list[Event]:
        """The next message of one batch's stream."""
        try:
            ref = next(stream.gen)
        except StopIteration:
            if stream.reported < stream.trials:  # the stream ended early: the worker is gone
                return self._lost(name, f"its stream of batch {stream.batch} ended after "
                                        f"{stream.reported} of its {stream.trials} trials")
            self._actors[name].streams.remove(stream)
            return [BatchDone(name, stream.batch)]
        try:
            messages = ray.get(ref)
        except RayActorError as e:
            return self._lost(name, why_dead(e), e.actor_init_failed)
        except RayError as e:  # an exception escaped the worker's loop: treat as a death
            return self._lost(name, why_dead(e))
        return [e for message in messages for e in self._events(name, stream, message)]

    def _events(self, name: str, stream: _Stream, message: WorkerMessage) -> list[Event]:
        if isinstance(message, Finished):
            stream.reported += len(message.records)
        return [event_of(name, stream.batch, message)]

    def _lost(self, name: str, why: str, init_failed: bool = False) -> list[Event]:
        events = self.settle(name, timeout_s=5.0)
        self.kill(name)
        return [*events, WorkerLost(name, why, init_failed)]

    def settle(self, worker: str, timeout_s: float) -> list[Event]:
        actor = self._actors.get(worker)
        if actor is None:
            return []
        deadline = time.monotonic() + timeout_s
        events: list[Event] = []
        for stream in list(actor.streams):
            while True:
                left = max(0.0, deadline - time.monotonic())
                ready, _ = ray.wait([stream.gen], timeout=left)
                if not ready:
                    break
                try:
                    messages = ray.get(next(stream.gen), timeout=5)
                except StopIteration:
                    if stream.reported == stream.trials:
                        actor.streams.remove(stream)
                        events.append(BatchDone(worker, stream.batch))
                    break
                except (RayError, GetTimeoutError):
                    return events
                events += [e for message in messages
                           for e in self._events(worker, stream, message)]
        return events

    def kill(self, worker: str) -> None:
        actor = self._actors.pop(worker, None)
        if actor is None or (self._watch is not None and self._watch.gone is not None):
            return  # with the GCS gone ray.kill would wait on it, for a worker gone with it
        done = threading.Event()

        def end() -> None:
            try:
                with contextlib.suppress(RayError):
                    ray.kill(actor.handle, no_restart=True)
            finally:
                done.set()

        # ray.kill of a worker the GCS has not placed yet waits on the GCS: it is awaited
        # only while the head still counts as up. (Killing is what a stop does: it must
        # not raise.)
        threading.Thread(target=end, name="actor-kill", daemon=True).start()
        while not done.wait(0.1):
            try:
                self._check_head()
            except ClusterLost:
                return

    def retime(self, worker: str, configs: Sequence[dict[str, Any]], rounds: int,
               timeout_s: float, should_stop: Callable[[], bool]) -> Retimed:
        ref = self._actors[worker].handle.retime.remote(list(configs), rounds)
        deadline = time.monotonic() + timeout_s
        while not ray.wait([ref], timeout=0.25)[0]:
            self._check_head()
            if should_stop():
                raise RetimeAbandoned("stopped while re-timing")
            if time.monotonic() >= deadline:
                raise RetimeAbandoned(f"no answer within {timeout_s:g} s")
        try:
            return ray.get(ref)
        except RayError as e:  # its worker died, or re-timing raised there
            raise RetimeAbandoned(why_dead(e)) from None

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()
