"""The typed rows that cross from actors to storage and the sweep: a trial's record, and
the best config chosen from such records.

The TrialRecord dataclass is the one definition of a record's columns: their names, their
order (the trial table's), their types and which may be null. Everything else (the table's
column list, the journal's schema, the table's Arrow types) is derived from it.

Statuses and validation outcomes are closed sets; anything else is a bug, so the
constructor refuses it rather than letting it reach the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple, get_args

Status = Literal["ok", "compile_error", "runtime_error", "incorrect", "timeout", "crashed",
                 "pruned"]
Validation = Literal["passed", "failed", "skipped", "disabled"]
STATUSES: tuple[str, ...] = get_args(Status)
# A config the search decided not to run (sweep/search/strategies.py): a row, never a trial.
PRUNED: Status = "pruned"
VALIDATIONS: tuple[str, ...] = get_args(Validation)
MAX_ERROR_CHARS = 2048


# Built once: json.dumps with options builds an encoder per call, a third of its cost.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces. Used for configs and fingerprints."""
    return _CANONICAL.encode(value)


def valid_text(text: str) -> str:
    """text as valid Unicode: a lone surrogate (what Python makes of bytes that are not
    UTF-8, an undecodable file name in a kernel's exception) written as its escape,
    `\\udcff`, which every file and terminal can hold."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def clip_error(text: str | None) -> str | None:
    if text is None:
        return None
    if len(text) <= MAX_ERROR_CHARS:
        return text
    marker = " …[truncated]"
    return text[: MAX_ERROR_CHARS - len(marker)] + marker


@dataclass(frozen=True)
class TrialOutcome:
    """What a backend measured for one config; the worker adds who, where and when."""

    status: Status
    validation: Validation
    latency_ms: float | None = None
    latency_p20_ms: float | None = None
    latency_p80_ms: float | None = None
    error: str | None = None
    compile_ms: float | None = None
    # The launch compiled a config its compile pool had compiled, finding another binary:
    # the pool's processes are told (Compiler.missed). Not a column.
    missed: bool = False


class Where(NamedTuple):
    """Where a trial ran: the device type, the node, the worker."""

    device: str
    node: str
    worker: str


@dataclass(frozen=True)
class TrialRecord:
    """One trial's outcome. The fields are the trial table's columns, in its order (the
    parameters' columns go after `index`); a field added here is added everywhere."""

    index: int
    config: dict[str, Any]  # stored as its canonical JSON
    status: Status
    latency_ms: float | None  # exactly when status is "ok"
    latency_p20_ms: float | None
    latency_p80_ms: float | None
    validation: Validation
    error: str | None
    compile_ms: float | None
    device: str
    node: str
    worker: str
    attempt: int  # 1 for the first run of this config, counting re-runs
    started_at: float  # seconds since the epoch, UTC
    finished_at: float

    def __post_init__(self) -> None:
        # The same rules the journal's reader enforces: what it would refuse is never written.
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        if self.validation not in VALIDATIONS:
            raise ValueError(f"unknown validation {self.validation!r}")
        if self.status == "ok" and self.latency_ms is None:
            raise ValueError("an ok trial needs a latency")
        if self.status != "ok" and self.latency_ms is not None:
            raise ValueError(f"only an ok trial has a latency, not a {self.status} one")
        if self.attempt < 1:
            raise ValueError(f"attempt {self.attempt} is below 1")
        # Text a worker or a kernel wrote is escaped here, where the record is made: the
        # journal, the table and every JSON file then hold valid UTF-8.
        for name in ("error", "device", "node", "worker"):
            text = getattr(self, name)
            if text is not None and not text.isascii():
                object.__setattr__(self, name, valid_text(text))
        if self.error is not None and len(self.error) > MAX_ERROR_CHARS:
            object.__setattr__(self, "error", clip_error(self.error))

    @classmethod
    def from_outcome(
        cls,
        index: int,
        config: dict[str, Any],
        outcome: TrialOutcome,
        *,
        where: Where,
        attempt: int,
        started_at: float,
        finished_at: float,
    ) -> TrialRecord:
        # Field by field: `missed` is the pool's to know, not the table's.
        o = outcome
        return cls(index=index, config=config, status=o.status, validation=o.validation,
                   latency_ms=o.latency_ms, latency_p20_ms=o.latency_p20_ms,
                   latency_p80_ms=o.latency_p80_ms, error=o.error, compile_ms=o.compile_ms,
                   device=where.device, node=where.node, worker=where.worker,
                   attempt=attempt, started_at=started_at, finished_at=finished_at)

    def to_json(self) -> dict[str, Any]:
        # Shallow, unlike asdict's deep copy: this runs once per trial. The instance's
        # dict holds exactly the fields, in their order (__init__ sets them so).
        return dict(self.__dict__)

    def values(self) -> tuple[Any, ...]:
        """The fields' values in column order: what a worker sends (see from_values)."""
        return tuple(self.__dict__.values())

    @classmethod
    def from_values(cls, values: tuple[Any, ...]) -> TrialRecord:
        """A record from values() of one made (and checked) elsewhere. Unchecked: pickling
        records one by one costs several times more, at thousands of trials a second."""
        record = object.__new__(cls)
        record.__dict__.update(zip(TABLE_COLUMNS, values))
        return record

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(**data)


# Columns of the trial table other than the parameters; a parameter may not reuse one.
TABLE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TrialRecord))


@dataclass(frozen=True)
class Best:
    """The fastest config found on a device: one record shared by the tally that ranks
    trials, the snapshot and best.json."""

    index: int
    config: dict[str, Any]
    latency_ms: float
    device: str
