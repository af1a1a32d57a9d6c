"""What one `sweep run` or `sweep resume` (or a call of the Python API) asks of a session,
and how the session ended: the records the command and the API hand over and read back."""

from __future__ import annotations

from dataclasses import dataclass, field

from storage import cache
from storage.records import STATUSES
from sweep.run.contracts import Observer
from sweep.spec import SpecError


@dataclass(frozen=True)
class Request:
    """What one `sweep run` or `sweep resume` (or a call of the Python API) asks for
    besides the spec or run directory."""

    address: str | None = None  # the Ray cluster (see sweep/engines/ray/join.py's target)
    runtime: str | None = None  # --runtime: local | ray | auto (None: the spec's run.runtime)
    max_trials: int | None = None  # at most this many trials, then stop resumably
    time_budget_s: float | None = None  # stop resumably this long after the call began
    cache_partial: bool = False  # an interrupted run's best goes to the cache, as partial
    force: bool = False  # tune even when the cache holds a complete run's best
    observers: tuple[Observer, ...] = ()  # told of each finished trial (see contracts.py)


@dataclass
class SessionEnd:
    """How the session ended, beyond its exit code: for the Python API's result."""

    state: str  # a snapshot state; "cached": nothing ran, the cache answered
    cached: list[cache.CacheEntry] = field(default_factory=list)


def retry_statuses(text: str | None, name: str = "--retry") -> frozenset[str]:
    """The statuses `--retry` (or the API's retry) names: any but ok, comma-separated."""
    if text is None:
        return frozenset()
    allowed = [s for s in STATUSES if s != "ok"]
    given = frozenset(t.strip() for t in text.split(","))
    if not given or not given <= set(allowed):
        raise SpecError(f"{name}: expected statuses from {', '.join(allowed)} "
                        f"(comma-separated), got {text!r}")
    return given
