"""What the driver side and a worker exchange, as plain records: the seam's types, below
both sides, so the driver's rules and the runtimes depend on no worker's insides.

A worker is handed its WorkerSettings once and Batches after; it answers a batch with a
stream of messages (BatchStarted, TrialStarted, Note, Finished), which each runtime turns
into the driver's events (sweep/engines/runtime.py), and a re-timing with Retimed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from storage.records import TrialRecord


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float


@dataclass(frozen=True)
class Retimed:
    """The finalists re-timed side by side, in the order given, and torch's way of doing
    the same job timed in the same rotation where the backend runs kernels (None
    elsewhere, or when it failed): the baseline a user compares the winner against.
    baseline_of: the kernel's function that was timed, "baseline" or (a kernel without
    one) "reference"."""

    finalists: list[Timing]
    baseline: Timing | None = None
    baseline_of: str = "baseline"
    # The rounds each finalist was timed in, where not all were (see RACE_MARGIN in
    # actors/triton_backend.py): empty where every one ran every round.
    rounds: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CompileLimit:
    """How long one compile may take: a fixed limit (run.compile_timeout_s, or the trial
    timeout), or one learnt from this run's own compile times (actors/compile_limit.py)."""

    seconds: float
    median_s: float | None = None  # the run's median compile it was learnt from
    fixed_s: float | None = None  # the fixed limit it stands in for (learnt ones)

    def why(self) -> str:
        """The row's error of a compile this limit stopped: which limit, and why."""
        if self.median_s is None:
            return f"compile took longer than {self.seconds:g} s (run.compile_timeout_s)"
        return f"compile took longer than {self._learnt()}; {self._retry('it')}"

    def _learnt(self) -> str:
        assert self.median_s is not None
        return (f"{self.seconds:g} s, {self.seconds / self.median_s:.0f}x this run's median "
                f"compile of {self.median_s:.2g} s (run.compile_timeout_s: auto)")

    def _retry(self, what: str) -> str:
        return (f"sweep resume DIR --retry timeout gives {what} the full "
                f"{self.fixed_s or self.seconds:g} s")

    @staticmethod
    def stopped(status: str, error: str | None) -> bool:
        """Whether a row is one a compile limit ended (stopped it, or left it uncompiled
        as heavier than one it stopped): its compile never finished."""
        return status == "timeout" and (error or "").startswith(
            ("compile took longer than ", "not compiled: "))

    @staticmethod
    def stopped_learnt(status: str, error: str | None) -> bool:
        """Whether a row is one a learnt limit stopped (the rows its pool then rules out
        follow from it: actors/compile_limit.py's Stopped)."""
        return status == "timeout" and (error or "").startswith("compile took longer than ") \
            and "(run.compile_timeout_s: auto)" in (error or "")

    def why_heavier(self, index: int) -> str:
        """The row's error of a config not compiled: at least as heavy in every parameter
        as trial `index`, which this (learnt) limit stopped (actors/compile_limit.py)."""
        return (f"not compiled: at least as heavy in every parameter as trial {index}, "
                f"whose compile took longer than {self._learnt()}; "
                f"{self._retry('this config')}")


FORKS = "forks"  # WorkerSettings.prestarted's key of a fork server begun before the workers


def compile_weight(config: Mapping[str, Any], problem_keys: Sequence[str] = ()) -> float:
    """How slow a config is likely to compile: the work of one warp, the product of its
    integer parameters (tile sizes, stages) over its num_warps, its problem keys aside (a
    size is no compile's cost). More warps split a tile into less code per thread: on an
    H200 this ranked compile times with Spearman's rho 0.86 on Liger's RMSNorm and 0.73 on
    configs/matmul.yaml, the product with warps as a factor 0.11 and 0.40 (benchmarks/
    compile_weight_rank.py). Only the order matters."""
    weight = 1.0
    for key, value in config.items():
        if key in problem_keys or key == "num_warps":
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            weight *= value
    warps = config.get("num_warps", 4)
    usable = isinstance(warps, (int, float)) and not isinstance(warps, bool) and warps > 0
    return weight / warps if usable else weight


@dataclass(frozen=True)
class BatchStarted:
    """The worker began a batch: one of its trials is running."""


@dataclass(frozen=True)
class TrialStarted:
    """The trial `index` began on the device; `ordinal` counts the trials this worker began
    before it, so that the driver can tell the latest start when a worker's streams are
    read out of order."""

    index: int
    ordinal: int
    ahead: bool = False  # compiled ahead by the pool (its processes are up), not inline


@dataclass(frozen=True)
class Note:
    """Something the user should know about the worker that is no trial's outcome (its
    compile pool fell back, or is down, and why); said once."""

    text: str


@dataclass(frozen=True)
class Finished:
    """Records of trials that finished one after another, and their journal lines, encoded
    here when the worker knows the run (WorkerSettings.run): encoding is most of the
    driver's cost per trial otherwise. Pickled as plain values, for the same reason."""

    records: tuple[TrialRecord, ...]
    lines: tuple[bytes | None, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return _finished, ([r.values() for r in self.records], self.lines)


def _finished(values: list[tuple[Any, ...]], lines: tuple[bytes | None, ...]) -> Finished:
    return Finished(tuple(map(TrialRecord.from_values, values)), lines)


@dataclass(frozen=True)
class WorkerFailed:
    """The runner thread raised (a bug): the batch's stream ends in this error."""

    text: str


WorkerMessage = BatchStarted | TrialStarted | Note | Finished


class Trial(NamedTuple):
    """One trial as the driver deals it and a worker takes it."""

    index: int  # type: ignore[assignment]  # the config's, in place of tuple.index
    config: dict[str, Any]  # as the worker launches it (a problem's keys in it)
    attempt: int


@dataclass(frozen=True)
class Batch:
    """What TrialWorker.run gets. One object, so Ray pickles it whole: given a list, Ray's
    msgpack walks every trial in Python, a cost per trial the driver pays."""

    number: int
    trials: list[Trial]
    ahead: Sequence[tuple[int, dict[str, Any]]] = ()
    limit: CompileLimit | None = None


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs to build its backend; plain data, so Ray ships it cheaply."""

    backend: str  # cuda | interpret | simulate | replay
    kernel: str
    problem: Mapping[str, Any]
    trial_timing: tuple[float, float]  # (warmup_ms, rep_ms) of each config's timing
    finalist_timing: tuple[float, float]  # and of the finalists' re-timing
    tolerance: tuple[float, float] | None
    seed: int
    simulate: Mapping[str, Any]
    screen: bool = False  # each config's timing is a screen (actors/timing.py)
    compile_workers: int = 0  # processes compiling ahead of the GPU (cuda, replay)
    compile_timeout_s: float = 60.0  # the fixed limit until the driver sends another
    # run.compile_timeout_s: auto: each compile pool also learns a limit from its own
    # compiles (actors/compile_limit.py); False on a retry, which gets the fixed one.
    compile_limit_auto: bool = False
    kernel_path: str = ""  # where a "module:attr" kernel may live besides installed packages
    replay: Mapping[str, Any] = field(default_factory=dict)  # the replay backend's options
    # Launchers started before the workers, by GPU id (cpuN: the interpreter's Nth), and
    # under FORKS a prepared fork server for their compile pools: (socket, key, pid);
    # see sweep/engines/prestart.py.
    prestarted: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)
    run: str = ""  # the run's fingerprint, which journal lines carry ("": lines not encoded)
    # Keyword arguments passed on every launch and compile besides the config's.
    fixed: dict[str, Any] = field(default_factory=dict)
    # A sweep over problems: the problem keys each config carries (over `problem`, the
    # first problem's), which its record leaves out.
    problem_keys: tuple[str, ...] = ()
