"""The replay backend: a recorded trial table played back on simulated GPUs and compile
slots, in real time (scaled), through the same driver, worker and scheduling code as a GPU
run. It lets scheduling be measured and tested on a machine without a GPU against what a
GPU sweep really did: each config compiles for as long as it did there, then holds its
simulated GPU for as long as its trial took, and ends as it ended.

A compile recorded as a timeout of the compile limit never finishes here either (it runs
into this run's limit); a trial recorded as a timeout of the trial clock hangs, and one
recorded `crashed` kills its worker, so the driver's fault handling is replayed as well.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.compile_limit import Stopped
from actors.compiles import Compiled
from actors.protocol import CompileLimit, Retimed, Timing
from storage.records import TrialOutcome, canonical_json
from storage.schema import REPLAY_COLUMNS


@dataclass(frozen=True)
class Recorded:
    """One config's row of the recorded table, reduced to what replay needs."""

    status: str
    validation: str
    latency_ms: float | None
    latency_p20_ms: float | None
    latency_p80_ms: float | None
    error: str | None
    compile_s: float  # inf: the compile never finished
    gpu_s: float  # the trial from its start on the device to its record

    @property
    def compile_failed(self) -> bool:
        return self.status == "compile_error" or self.compile_s == float("inf")


class ReplayTableError(ValueError):
    """The recorded table cannot be played back: one line naming it (the spec's check of
    it passed, so something replaced it since)."""


def _rows(table: str) -> list[dict[str, Any]]:
    """The recorded table's rows, read through the descriptor checked to be a regular
    file (storage/table.py): pyarrow's own open by path calls a FIFO missing, and blocks
    on one swapped in after its check."""
    import pyarrow as pa

    from storage.readback import ReadBackError
    from storage.table import read_parquet

    try:
        data = read_parquet(table)
    except (OSError, ValueError, pa.ArrowException) as e:  # ArrowInvalid is a ValueError
        why = e.why if isinstance(e, ReadBackError) else getattr(e, "strerror", None) or e
        raise ReplayTableError(f"cannot read {table} as Parquet ({why})") from None
    missing = [c for c in REPLAY_COLUMNS if c not in data.column_names]
    if missing:
        raise ReplayTableError(f"{table} lacks the column(s) {', '.join(missing)} of a "
                               "trial table")
    return data.select(list(REPLAY_COLUMNS)).to_pylist()


def _read(options: Mapping[str, Any]) -> dict[str, Recorded]:
    rows = _rows(options["table"])
    scale = float(options.get("time_scale", 1.0))
    table = {}
    for row in rows:
        never_compiled = CompileLimit.stopped(row["status"], row["error"])
        compile_s = float("inf") if never_compiled else (row["compile_ms"] or 0.0) / 1e3
        gpu_s = (row["finished_at"] - row["started_at"]).total_seconds()
        if row["status"] in ("compile_error", "timeout"):
            gpu_s = 0.0
        table[row["config"]] = Recorded(
            row["status"], row["validation"], row["latency_ms"], row["latency_p20_ms"],
            row["latency_p80_ms"], row["error"], compile_s * scale, max(gpu_s, 0.0) * scale)
    return table


class ReplayBackend:
    device_name = "replayed"

    def __init__(self, table: dict[str, Recorded]) -> None:
        self.table = table

    @classmethod
    def load(cls, options: Mapping[str, Any]) -> ReplayBackend:
        return cls(_read(options))

    def run_trial(self, config: Mapping[str, Any],
                  compiled: Compiled | None = None) -> TrialOutcome:
        row = self.table.get(canonical_json(dict(config)))
        if row is None:
            return TrialOutcome("runtime_error", "skipped",
                                error="replay: the recorded table has no row for this config")
        if compiled is not None and not compiled.ok:
            return TrialOutcome("timeout" if compiled.timed_out else "compile_error",
                                "skipped", error=compiled.error,
                                compile_ms=compiled.compile_ms)
        compile_ms = compiled.compile_ms if compiled is not None else None
        if row.status == "crashed":
            os._exit(17)  # as the config's process died on the GPU
        if row.status == "timeout":  # the trial itself hung: the driver's clock must end it
            threading.Event().wait()
        time.sleep(row.gpu_s)
        return TrialOutcome(row.status, row.validation,  # type: ignore[arg-type]
                            latency_ms=row.latency_ms, latency_p20_ms=row.latency_p20_ms,
                            latency_p80_ms=row.latency_p80_ms, error=row.error,
                            compile_ms=compile_ms)

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> Retimed:
        """A replayed config's latency is the recorded one: re-timing gives it back. The
        recording holds no torch baseline."""
        out = []
        for c in configs:
            row = self.table[canonical_json(dict(c))]
            ms = row.latency_ms or float("nan")
            out.append(Timing(ms, row.latency_p20_ms or ms, row.latency_p80_ms or ms))
        return Retimed(out)


# What compiling a config found in Triton's on-disk cache costs (load and check it): on an
# H200, 3-22 ms for configs another process had compiled.
CACHE_HIT_S = 0.015


class ReplayCompiler:
    """A compile pool of `slots` simulated processes on the real clock: a config holds a
    slot for its recorded compile time (or until the limit stops it). Workers of one
    replay share a directory standing in for Triton's on-disk cache, as the workers of
    one node do: a config compiled by one is a cache hit for the others."""

    def __init__(self, table: dict[str, Recorded], slots: int, limit: CompileLimit,
                 cache_dir: str | None = None, scale: float = 1.0,
                 problem_keys: Sequence[str] = ()) -> None:
        self.table = table
        self.limit = limit
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if self.cache_dir is not None:  # on another node than the driver's, a new one
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.hit_s = CACHE_HIT_S * scale
        self._free = slots
        # (key, config, when it was asked for): a compile never starts before that
        self._queue: deque[tuple[int, str, float]] = deque()
        self._hints: dict[int, tuple[str, float]] = {}
        # (start, key, config, seconds it takes)
        self._running: list[tuple[float, int, str, float]] = []
        self._queued: set[int] = set()
        self._done: dict[int, Compiled] = {}
        self._stopped = Stopped(problem_keys)  # as a real pool rules configs out
        self._submitted: set[int] = set()  # (a hint stopped rules nothing out: see there)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, options: Mapping[str, Any], slots: int, limit: CompileLimit,
             problem_keys: Sequence[str] = ()) -> ReplayCompiler:
        return cls(_read(options), slots, limit, options.get("cache_dir"),
                   float(options.get("time_scale", 1.0)), problem_keys)

    def set_limit(self, limit: CompileLimit) -> None:
        self.limit = limit

    def started(self) -> bool:
        return True  # simulated slots need no start-up

    def withdraw(self, key: int) -> bool:
        return False  # never needed: see started()

    def submit(self, key: int, config: Mapping[str, Any]) -> None:
        with self._lock:
            self._hints.pop(key, None)
            self._submitted.add(key)
            now = time.monotonic()
            if key not in self._done and key not in self._queued:
                why = self._stopped.why(config)
                if why is not None:
                    self._done[key] = Compiled(False, None, why, timed_out=True)
                else:
                    self._queued.add(key)
                    self._queue.append((key, canonical_json(dict(config)), now))
            self._advance(now)

    def hint(self, key: int, config: Mapping[str, Any]) -> None:
        with self._lock:
            now = time.monotonic()
            if key not in self._done and key not in self._queued \
                    and self._stopped.why(config) is None:
                self._hints[key] = canonical_json(dict(config)), now
            self._advance(now)

    def notices(self) -> list[str]:
        return []

    def missed(self) -> None:
        pass  # a replayed compile has no binary to miss

    def down(self) -> bool:
        return False

    def take(self, keys: Iterable[int]) -> tuple[int, Compiled] | None:
        with self._lock:
            self._advance(time.monotonic())
            for key in keys:
                if key in self._done:
                    return key, self._done.pop(key)
        return None

    def wait(self, timeout_s: float) -> None:
        with self._lock:
            now = time.monotonic()
            ends = [self._end(start, took) for start, _, _, took in self._running]
        time.sleep(max(0.0, min([now + timeout_s, *ends]) - now))

    def close(self) -> None:
        pass

    def _compile_s(self, config: str) -> float:
        if self._cached(config).exists():
            return self.hit_s
        row = self.table.get(config)
        return row.compile_s if row is not None else 0.0

    def _cached(self, config: str) -> Path:
        if self.cache_dir is None:
            return Path("/nonexistent")
        return self.cache_dir / hashlib.sha256(config.encode()).hexdigest()

    def _end(self, start: float, took: float) -> float:
        return start + min(took, self.limit.seconds)

    def _advance(self, now: float) -> None:
        """Finish what has ended by now; start queued configs (then hints) on free slots,
        each at the moment its slot came free."""
        free_at = [now] * self._free
        progressed = True
        while progressed:
            progressed = False
            # The limit may have changed since a compile started: ends are recomputed.
            for end, start, key, config, took in sorted(
                    (self._end(start, took), start, key, config, took)
                    for start, key, config, took in self._running):
                if end > now:
                    break
                self._running = [r for r in self._running if r[1] != key]
                self._queued.discard(key)
                self._done[key] = self._outcome(config, start, end, took)
                if self._done[key].timed_out and key in self._submitted and \
                        self._stopped.add(key, json.loads(config), self.limit):
                    self._rule_out_queued()
                heapq.heappush(free_at, end)
                progressed = True
            while free_at and (self._queue or self._hints):
                free = heapq.heappop(free_at)
                if self._queue:
                    key, config, asked = self._queue.popleft()
                else:
                    key = next(iter(self._hints))
                    config, asked = self._hints.pop(key)
                    self._queued.add(key)
                start = max(free, asked)
                self._running.append((start, key, config, self._compile_s(config)))
                progressed = True
        self._free = len(free_at)

    def _rule_out_queued(self) -> None:
        for key, config, asked in list(self._queue):
            why = self._stopped.why(json.loads(config))
            if why is not None:
                self._queue.remove((key, config, asked))
                self._queued.discard(key)
                self._done[key] = Compiled(False, None, why, timed_out=True)
        for key in [k for k, (c, _) in self._hints.items()
                    if self._stopped.why(json.loads(c)) is not None]:
            del self._hints[key]

    def _outcome(self, config: str, start: float, end: float, took: float) -> Compiled:
        ms = (end - start) * 1e3
        row = self.table.get(config)
        if row is None:
            return Compiled(True, ms)
        if took > self.limit.seconds:
            return Compiled(False, ms, self.limit.why(), timed_out=True)
        if self.cache_dir is not None:
            self._cached(config).touch()
        if row.status == "compile_error":
            return Compiled(False, ms, row.error)
        return Compiled(True, ms)
