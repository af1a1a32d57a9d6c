"""The adaptive compile limit's rule, in one place: how long a compile may take, learnt from
the compiles that have ended. Both sides apply it: each compile pool to its own compiles as
each ends (so the limit acts from a run's first compiles, on compiles already running, in
every runtime, with no trial record needed), and the driver to every worker's records and
an earlier session's (sweep/search/scheduling.py), which it sends to the workers.

A compile far beyond the run's others is rarely worth waiting for: on an H200 the
neighbours of configs that never finished compiling ran 8-18x slower than the best
(GPU-NOTES), and a few such compiles at a sweep's tail held it for a minute each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.protocol import CompileLimit

# Once MIN_COMPILES compiles have ended, a compile may take FACTOR times their median, but
# never less than FLOOR_S (a few quick compiles are no reason to stop a config that takes
# seconds) nor more than the fixed limit. 5 s: on an H200 no config of Liger's RMSNorm
# that compiled for over 5 s ran within 11x of the best (see learnt), and a 10 s floor
# spent 300 of that sweep's 659 compile-seconds on 30 configs it then stopped
# (benchmarks/results/heavy_compiles_adopt-2026-12-03.json). A "compile" of under
# CACHE_HIT_MS found its binary in Triton's cache (or failed at once): it says nothing of
# how long compiling takes.
MIN_COMPILES = 8
FACTOR = 10.0
FLOOR_S = 5.0
CACHE_HIT_MS = 50.0


def learnt(fixed_s: float, samples_ms: list[float]) -> CompileLimit:
    """The limit that samples_ms (compile times that say something) give: the fixed one
    until there are MIN_COMPILES of them, or where the rule would not go below it."""
    if len(samples_ms) < MIN_COMPILES:
        return CompileLimit(fixed_s)
    ordered = sorted(samples_ms)
    # The median, not a high percentile: on an H200 a tenth of Liger's RMSNorm configs
    # compiled for 7-60 s (p90 6.8 s: a limit past the fixed 60 s), the median for 0.22 s,
    # and none compiling over 5 s ran within 11x of the best's latency (benchmarks/results/
    # heavy_compiles_diag_liger_rms-2026-12-03.parquet).
    median = _percentile(ordered, 0.5) / 1e3
    seconds = min(fixed_s, max(FLOOR_S, FACTOR * median))
    if seconds >= fixed_s:
        return CompileLimit(fixed_s)
    return CompileLimit(round(seconds, 1), median, fixed_s)


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


class Learner:
    """Compile times as they come, and the limit they give (see learnt)."""

    def __init__(self, fixed_s: float, adaptive: bool) -> None:
        self.fixed_s = fixed_s
        self.adaptive = adaptive
        self._ms: list[float] = []
        self.current = CompileLimit(fixed_s)

    def add(self, ms: Iterable[float | None]) -> bool:
        """Take compile times that ended (not ones a limit stopped); True if the limit
        changed."""
        before = len(self._ms)
        self._ms.extend(m for m in ms if m is not None and math.isfinite(m)
                        and m >= CACHE_HIT_MS)
        if not self.adaptive or len(self._ms) == before:
            return False
        now = learnt(self.fixed_s, self._ms)
        changed, self.current = now != self.current, now
        return changed


def heavier(config: Mapping[str, Any], than: Mapping[str, Any],
            problem_keys: Sequence[str] = ()) -> bool:
    """Whether config is at least as heavy to compile as `than` in every parameter: each
    integer one as large or larger, num_warps as few or fewer, every other value the same
    (a problem's too: a size a kernel takes as a constexpr is code, compiled anew).
    compile_weight's model (actors/protocol.py) as a partial order, which holds where the
    weight's order is only likely: more of the same code per thread compiles no faster."""
    if config.keys() != than.keys():
        return False
    for key, value in than.items():
        mine = config[key]
        integers = all(isinstance(v, int) and not isinstance(v, bool) for v in (mine, value))
        if integers and key not in problem_keys:
            if mine > value if key == "num_warps" else mine < value:
                return False
        elif mine != value:
            return False
    return True


class Stopped:
    """Configs a learnt limit stopped, and the rule they give: a config at least as heavy
    in every parameter as one of them is not compiled. It would compile longer still, so
    the limit would stop it too: on an H200, 56 of Liger's RMSNorm's 324 configs ran to
    the 5 s limit, 280 of the sweep's 461 compile-seconds, and every config at least as
    heavy as one of them was one of them (benchmarks/results/heavy_compiles_key_runs/
    liger_rms.tar.gz). A fixed limit (the user's, or a retry's) stops no config uncompiled."""

    def __init__(self, problem_keys: Sequence[str] = ()) -> None:
        self.problem_keys = tuple(problem_keys)
        self._stopped: list[tuple[int, Mapping[str, Any], CompileLimit]] = []

    def add(self, key: int, config: Mapping[str, Any], limit: CompileLimit) -> bool:
        """A config `limit` stopped; whether it is one the rule goes by (a learnt limit's)."""
        if limit.median_s is None:
            return False
        self._stopped.append((key, config, limit))
        return True

    def why(self, config: Mapping[str, Any]) -> str | None:
        """The row's error of config, if a stopped config rules it out; else None."""
        for key, stopped, limit in self._stopped:
            if heavier(config, stopped, self.problem_keys):
                return limit.why_heavier(key)
        return None


def tighter(a: CompileLimit, b: CompileLimit) -> CompileLimit:
    """The limit that stops a compile first (the driver's and a pool's own)."""
    return a if a.seconds <= b.seconds else b
