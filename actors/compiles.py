"""A compile's outcome as a worker's runner and its launcher see it, and what a worker
needs of its compile pool: the real one (actors/compile_pool.py) or the replay backend's
(actors/replay.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from actors.protocol import CompileLimit


@dataclass(frozen=True)
class Compiled:
    ok: bool
    compile_ms: float | None
    error: str | None = None
    timed_out: bool = False
    binary: str | None = None  # its hash, which the launch checks it loads


class Compiler(Protocol):
    """What a worker needs of its compile pool (a real one, or the replay backend's)."""

    def submit(self, key: int, config: Mapping[str, Any]) -> None: ...

    def hint(self, key: int, config: Mapping[str, Any]) -> None: ...

    def take(self, keys: Iterable[int]) -> tuple[int, Compiled] | None:
        """The first of keys, in their order, whose compile has ended; handed out once."""

    def wait(self, timeout_s: float) -> None:
        """Until a compile may have ended, or timeout_s."""

    def set_limit(self, limit: CompileLimit) -> None: ...

    def started(self) -> bool:
        """Whether any of its processes is up (until then its worker compiles itself)."""

    def withdraw(self, key: int) -> bool:
        """Take back a submitted config that no process has begun; False if one has."""

    def notices(self) -> list[str]:
        """What its worker should tell the user about the pool (each said once)."""

    def down(self) -> bool:
        """Whether no process of it can start: its worker compiles every config itself."""

    def missed(self) -> None:
        """A launch loaded another binary than the one compiled for its config."""

    def close(self) -> None: ...
