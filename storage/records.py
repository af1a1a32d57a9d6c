"""The trial record: the one typed row that crosses from actors to storage.

Statuses and validation outcomes are closed sets; anything else is a bug, so the
constructor refuses it rather than letting it reach the table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

Status = Literal["ok", "compile_error", "runtime_error", "incorrect", "timeout", "crashed"]
Validation = Literal["passed", "failed", "skipped", "disabled"]
STATUSES: tuple[str, ...] = get_args(Status)
VALIDATIONS: tuple[str, ...] = get_args(Validation)
MAX_ERROR_CHARS = 2048

# Columns of the trial table other than the parameters; a parameter may not reuse one.
TABLE_COLUMNS: tuple[str, ...] = (
    "index", "config", "status", "latency_ms", "latency_p20_ms", "latency_p80_ms",
    "validation", "error", "compile_ms", "device", "node", "worker", "attempt",
    "started_at", "finished_at",
)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces. Used for configs and fingerprints."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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


@dataclass(frozen=True)
class TrialRecord:
    index: int
    config: dict[str, Any]
    status: Status
    validation: Validation
    latency_ms: float | None
    latency_p20_ms: float | None
    latency_p80_ms: float | None
    error: str | None
    compile_ms: float | None
    device: str
    node: str
    worker: str
    attempt: int
    started_at: float  # seconds since the epoch, UTC
    finished_at: float

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        if self.validation not in VALIDATIONS:
            raise ValueError(f"unknown validation {self.validation!r}")
        if self.status == "ok" and self.latency_ms is None:
            raise ValueError("an ok trial needs a latency")
        if self.error is not None and len(self.error) > MAX_ERROR_CHARS:
            object.__setattr__(self, "error", clip_error(self.error))

    @classmethod
    def from_outcome(
        cls,
        index: int,
        config: dict[str, Any],
        outcome: TrialOutcome,
        *,
        device: str,
        node: str,
        worker: str,
        attempt: int,
        started_at: float,
        finished_at: float,
    ) -> TrialRecord:
        return cls(index=index, config=config, device=device, node=node, worker=worker,
                   attempt=attempt, started_at=started_at, finished_at=finished_at,
                   **asdict(outcome))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(**data)
