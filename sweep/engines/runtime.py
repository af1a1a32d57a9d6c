"""The seam between the driver's rules and the machinery that runs workers.

The driver (sweep/run/driver.py) decides what runs where, what a death or a silence means and
when to give up; a Runtime starts workers, hands them batches, reports what happened as
events and kills them. Two run real workers: sweep/engines/local_runtime.py (processes of this
machine, the default on one) and sweep/engines/ray/runtime.py (Ray actors); the tests drive
the same rules through an in-process runtime with a clock they control
(tests/fake_runtime.py), so fault paths are tested deterministically in milliseconds.

Events for one worker arrive in the order the worker produced them; a worker's events stop
after its WorkerLost, or once the driver kills it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from actors.protocol import (
    BatchStarted,
    CompileLimit,
    Finished,
    Note,
    Retimed,
    TrialStarted,
    WorkerMessage,
)
from actors.protocol import Trial as Trial  # what a runtime's submit takes
from storage.records import TrialRecord

if TYPE_CHECKING:
    from actors.protocol import WorkerSettings
    from sweep.spec import Spec



@dataclass(frozen=True)
class Placement:
    """How many workers, and what each asks of the cluster."""

    workers: int
    num_gpus: float = 0.0
    num_cpus: float = 0.0
    env: Mapping[str, str] = field(default_factory=dict)
    compile_workers: int = 0  # compile processes per worker (cuda)
    # One device type per worker on a cluster of several (empty: one type, or unknown):
    # each worker asks for a device of its type, and finalists are re-timed per type.
    kinds: tuple[str, ...] = ()
    resources: Mapping[str, float] = field(default_factory=dict)  # more, per worker


@dataclass(frozen=True)
class WorkerUp:
    """The worker is ready to run trials (its device and compile pool set up)."""

    worker: str
    device: str
    node: str
    # The worker's torch and Triton versions (a cluster's head may have other builds than
    # its GPU nodes): what the best-config cache keys a device's best by.
    versions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchBegan:
    """The worker began the batch: its first trial's clock starts now."""

    worker: str
    batch: int


@dataclass(frozen=True)
class TrialBegan:
    """The trial began on the worker's device (only workers that run trials out of the
    order sent say so; see actors/worker.py). ordinal: trials the worker began before it."""

    worker: str
    batch: int
    index: int
    ordinal: int
    ahead: bool = False  # its compile came from the worker's pool, which is up


@dataclass(frozen=True)
class TrialsDone:
    """Trials of the batch finished, in this order (a worker sends those finished at once
    together: the driver's cost is per event)."""

    worker: str
    batch: int
    records: Sequence[TrialRecord]
    lines: Sequence[bytes | None]  # each record's journal line, where the worker encoded it


@dataclass(frozen=True)
class BatchDone:
    """Every trial of the batch was reported."""

    worker: str
    batch: int


@dataclass(frozen=True)
class WorkerNote:
    """Something the worker tells the user that is no trial's outcome (its compile pool
    fell back to processes of their own, or is down, and why)."""

    worker: str
    text: str


@dataclass(frozen=True)
class WorkerLost:
    """The worker's process is gone (or its stream broke). Messages it sent just before
    dying may never arrive, so what it was running is only a suspicion. why: one line of
    the sweep's own (what the worker raised, how its process ended), never a runtime's
    multi-line report."""

    worker: str
    why: str
    init_failed: bool = False  # its constructor raised: a start-up failure, not a trial's


Event = WorkerUp | BatchBegan | TrialBegan | TrialsDone | BatchDone | WorkerNote | WorkerLost


def event_of(worker: str, batch: int, message: WorkerMessage) -> Event:
    """A worker's message about one of its batches, as the driver's event: the one place
    the two vocabularies meet (a worker knows neither its name nor the batch's number)."""
    if isinstance(message, Finished):
        return TrialsDone(worker, batch, message.records, message.lines)
    if isinstance(message, TrialStarted):
        return TrialBegan(worker, batch, message.index, message.ordinal, message.ahead)
    if isinstance(message, BatchStarted):
        return BatchBegan(worker, batch)
    if isinstance(message, Note):
        return WorkerNote(worker, message.text)
    raise TypeError(f"not a worker's message: {message!r}")


class ClusterLost(Exception):
    """The cluster's head (its GCS) stopped answering: no worker can be started or
    replaced any more, and Ray ends this process once the GCS has been away for
    gcs_rpc_server_reconnect_timeout_s (60 s). The run stops, resumable."""


class RetimeAbandoned(Exception):
    """Re-timing did not answer in time, its worker died, or a stop was asked for
    meanwhile."""


class ConnectAbandoned(Exception):
    """A stop was asked for, or the cluster did not answer, while the engine was still
    joining it or starting (what it had started is ended)."""


class Runtime(Protocol):
    def start(self, worker: str, kind: str = "") -> None:
        """Start a worker (on a device of the kind, a Placement.kinds entry, if given); a
        WorkerUp (or WorkerLost) event follows when it is ready."""

    def submit(self, worker: str, batch: int, trials: Sequence[Trial],
               ahead: Sequence[tuple[int, dict[str, Any]]],
               limit: CompileLimit | None = None) -> None:
        """Queue batch number `batch` (0, 1, ... per worker). `ahead`: configs some worker
        gets soon, which an idle compile pool may work on. `limit`: how long a compile may
        take from now on, when the driver has changed it."""

    def set_limit(self, worker: str, limit: CompileLimit) -> None:
        """Tell the worker's compile pool a new compile limit now, without a batch: its
        compiles running past it stop (a search may send nothing until they end)."""

    def poll(self, timeout_s: float) -> list[Event]:
        """Events that have happened, waiting up to timeout_s for the first one."""

    def settle(self, worker: str, timeout_s: float) -> list[Event]:
        """Before a worker is given up: the events it has produced, waiting up to
        timeout_s for streams that are ending (a dead worker's soon do, a hung one's
        never)."""

    def kill(self, worker: str) -> None:
        """Stop the worker now; no event of it is reported afterwards."""

    def retime(self, worker: str, configs: Sequence[dict[str, Any]], rounds: int,
               timeout_s: float, should_stop: Callable[[], bool]) -> Retimed:
        """Re-time configs side by side on one up worker; waits for the answer, raising
        RetimeAbandoned past timeout_s or once should_stop() says so."""

    def monotonic(self) -> float:
        """The clock for timeouts and deadlines: never steps."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch, for records."""


class Engine(Protocol):
    """Where a run's workers live and what they may use: this machine's own processes
    (sweep/engines/local_runtime.py) or a Ray cluster (sweep/engines/ray/engine.py). A
    session is handed one, as Ray Tune's controller is handed its resource manager, and
    asks it in turn: connect, the backend and placement it allows, then a Runtime for the
    driver."""

    name: str  # "local" | "ray": what the run's first lines and its timeline say

    def on_this_machine(self) -> bool:
        """Whether every worker runs on this machine: work can begin before the engine is
        up (sweep/engines/prestart.py), and this machine alone names the devices."""

    def connect(self, stop_requested: Callable[[], bool], say: Callable[[str], None]) -> None:
        """Make the engine ready (join or start Ray); ConnectAbandoned once stop_requested()
        says so meanwhile, SpecError for an address or cluster that refuses."""

    def resolve_backend(self, spec: Spec) -> str:
        """The backend `run.backend` means here (auto: cuda where there are GPUs)."""

    def placement(self, spec: Spec, backend: str) -> Placement:
        """How many workers, and what each asks for; SpecError where the spec asks for
        what is not there."""

    def device_names(self, kinds: Sequence[str], stop_requested: Callable[[], bool]
                     ) -> list[tuple[str, dict[str, str]]] | None:
        """The name of a GPU of each kind, and the torch and Triton versions there (the
        best-config cache's key); None where that cannot be told in time."""

    def runtime(self, settings: WorkerSettings, placement: Placement,
                batches: int) -> Runtime:
        """The Runtime the driver runs workers through (batches: the most a worker holds
        at once)."""

    def divert_reports(self, log: Path) -> None:
        """From now on, what workers or the engine print goes to `log`, not the terminal."""

    def mark_lost(self) -> None:
        """The cluster was lost (ClusterLost): close() must not wait on it."""

    def close(self) -> None:
        """Everything it started ends (a Ray it joined is left)."""
