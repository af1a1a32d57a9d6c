"""The simulate backend: no kernel code, any parameter names and values, outcomes and
latencies a deterministic function of (seed, config).

It exists so that tests, demos and scale runs can drive the whole system (queue, journal,
faults, resume) without a GPU, and it is cheap per trial: one hash and one sleep.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from actors.protocol import Retimed, Timing
from storage.records import TrialOutcome, canonical_json


def draws(seed: int, config: Mapping[str, Any]) -> tuple[float, float]:
    """Two uniform numbers in [0, 1) fixed by the seed and the config."""
    digest = hashlib.blake2b(f"{seed}:{canonical_json(dict(config))}".encode(),
                             digest_size=16).digest()
    scale = float(1 << 64)
    return (int.from_bytes(digest[:8], "little") / scale,
            int.from_bytes(digest[8:], "little") / scale)


class SimulatedBackend:
    def __init__(self, *, trial_ms: float, fail_rate: float, crash_rate: float,
                 hang_rate: float, seed: int, device: str = "") -> None:
        """device: a simulated device type (simulate.devices), with latencies of its own;
        "" the one untyped kind."""
        self.device_name = device or "simulated"
        self._salt = {"@device": device} if device else {}  # no parameter has that name
        self.trial_ms = trial_ms
        self.fail_rate = fail_rate
        self.crash_rate = crash_rate
        self.hang_rate = hang_rate
        self.seed = seed

    def latency_ms(self, config: Mapping[str, Any], speed: float | None = None) -> float:
        if speed is None:
            speed = draws(self.seed, {**config, **self._salt})[1]
        return (self.trial_ms or 1.0) * (0.5 + speed)

    def run_trial(self, config: Mapping[str, Any], compiled: object = None) -> TrialOutcome:
        fate, speed = draws(self.seed, config)  # the same fate on every device type
        if self._salt:
            speed = draws(self.seed, {**config, **self._salt})[1]
        if fate < self.fail_rate:
            return TrialOutcome("compile_error", "skipped",
                                error="simulated compile error (simulate.fail_rate)")
        if fate < self.fail_rate + self.crash_rate:
            os._exit(17)  # the worker process dies, as a segfault would kill it
        if fate < self.fail_rate + self.crash_rate + self.hang_rate:
            threading.Event().wait()  # never returns: the driver's timeout must catch it
        if self.trial_ms > 0:
            time.sleep(self.trial_ms / 1e3)
        latency = self.latency_ms(config, speed)
        return TrialOutcome("ok", "skipped", latency_ms=latency,
                            latency_p20_ms=latency * 0.98, latency_p80_ms=latency * 1.02)

    def retime(self, configs: Sequence[Mapping[str, Any]], rounds: int) -> Retimed:
        """Simulated latencies carry no noise: re-timing gives them back unchanged. There
        is no torch baseline to time. Each round takes a trial's time, as the driver
        budgets a real one (a stop can land while it runs)."""
        if self.trial_ms > 0:
            time.sleep(self.trial_ms * max(1, rounds) / 1e3)
        return Retimed([Timing(self.latency_ms(c), self.latency_ms(c), self.latency_ms(c))
                        for c in configs])
