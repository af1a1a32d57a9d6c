"""What to compile first, and how long a compile may take.

Two lessons of GPU sweeps (BENCHMARKS.md, GPU-NOTES): the configs that compile slowest are
the largest tiles with the most stages, and a sweep that reaches them last ends with GPUs
idle behind them; and a compile far beyond the rest of the run's is rarely worth waiting
for (the neighbours of configs that never finished compiling ran 8-18x slower than the
best), so the limit comes from the run's own compile times rather than one fixed number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from actors.compile_limit import CACHE_HIT_MS, FACTOR, FLOOR_S, MIN_COMPILES, Learner
from actors.protocol import CompileLimit, compile_weight
from storage.records import TrialRecord
from sweep.spec.space import Space

# 0.2 s to order on the 2-core machine; a GPU space is rarely larger.
MAX_ORDERED = 100_000
# The heavy lane's share of the configs. A learnt limit stops compiles ten times the
# median's, in a space's heavy tail (17% of Liger's RMSNorm on an H200). Its recorded
# compiles, replayed on 15 processes with the limit and Stopped's rule: 31.1 s heaviest
# first, 17.6 s by lanes of 30% (19.1 s at 50%, 24.4 s at 20%); configs/matmul.yaml's,
# which no limit stopped, 2.44 and 2.59 s (benchmarks/compile_schedule.py, results/
# compile_schedule-2026-12-04.json).
HEAVY_SHARE = 0.3


def compile_order(space: Space, todo: Iterable[int]) -> list[int]:
    """todo in the order to hand out: two lanes taken in turn, each lightest first (by
    compile_weight; ties by index): the heaviest HEAVY_SHARE of the configs, and the rest.
    The heavy lane starts at once, so slow compiles are not the sweep's tail, and the
    light one between them keeps the GPUs fed while they run (all slow ones first starved
    the GPUs in replay; see BENCHMARKS.md). The heavy lane climbs from below: where a
    learnt limit starts to stop compiles, the configs beyond in every parameter are then
    not compiled at all (actors/compile_limit.py's Stopped), where heaviest first spent
    the limit on each of them. Beyond MAX_ORDERED configs, index order: ordering needs
    every config. In a sweep over problems the turn is a kernel config's: that config of
    every problem goes out together, so the problems interleave and one compile serves
    them all from Triton's cache (ties by its place in the product of the values)."""
    indices = list(todo)
    if len(indices) > MAX_ORDERED:
        return indices
    weights = [compile_weight(space.kernel_config(i)) for i in indices]
    place: list[tuple[Any, ...]] = [(i,) for i in indices]
    if len(space.starts) > 1:
        codes = [space.levels(n)[0] for n in space.kernel_names]  # unset: a code of its own
        place = [tuple(int(c[i]) for c in codes) for i in indices]
    ranked = sorted(range(len(indices)), key=lambda k: (weights[k], place[k], indices[k]))
    groups: list[list[int]] = []  # the ranked configs, a kernel config's problems together
    for k in ranked:
        if groups and place[groups[-1][0]] == place[k] and len(space.starts) > 1:
            groups[-1].append(k)
        else:
            groups.append([k])
    cut = len(groups) - math.ceil(len(groups) * HEAVY_SHARE)
    light, heavy = groups[:cut], groups[cut:]
    order: list[int] = []
    for g in range(max(len(light), len(heavy))):
        for lane in (heavy, light):
            if g < len(lane):
                order += lane[g]
    return [indices[k] for k in order]


class AdaptiveLimit:
    """The compile limit a run sends its workers: `fixed_s` until enough compiles have
    ended, then the rule of actors/compile_limit.py over every worker's compiles and an
    earlier session's; just `fixed_s` when adaptive is off (a retry's). Each pool also
    applies the rule to its own compiles as they end, before any record comes."""

    def __init__(self, fixed_s: float, adaptive: bool,
                 seen: Iterable[tuple[str, float | None]] = ()) -> None:
        """seen: (status, compile_ms) of trials an earlier session recorded."""
        self._learner = Learner(fixed_s, adaptive)
        self._observe(seen)

    @property
    def fixed_s(self) -> float:
        return self._learner.fixed_s

    @property
    def adaptive(self) -> bool:
        return self._learner.adaptive

    @property
    def current(self) -> CompileLimit:
        return self._learner.current

    def observe_compiles(self, ms: Iterable[float]) -> None:
        """Compile times measured outside any trial (the early pool's, prestart.py)."""
        self._observe(("ok", m) for m in ms)

    def observe(self, records: Iterable[TrialRecord]) -> None:
        self._observe([(r.status, r.compile_ms) for r in records])

    def _observe(self, seen: Iterable[tuple[str, float | None]]) -> None:
        # A compile stopped by a limit says only that it took longer: not a sample.
        self._learner.add(ms for status, ms in seen if status != "timeout")


__all__ = ["CACHE_HIT_MS", "FACTOR", "FLOOR_S", "MIN_COMPILES", "AdaptiveLimit",
           "compile_order"]
