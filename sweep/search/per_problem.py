"""A search of a sweep over problems: the spec's strategy run on each problem's configs,
side by side in one run, each problem's first configs warm-started from its neighbour's.

Each problem's search sees only its own configs (Space.part) and outcomes. A problem with
configs from the cache (the nearest cached sweep, decided when the run was created) starts
at once; in a guided search one without waits for the problem before it to have outcomes,
then starts with that neighbour's fastest configs: sizes that are close share their good
tiles. (Halving's one sample a problem, and a search with warm_start 0, wait for none.) What starts
when follows from the outcomes alone, so a resumed run replays the same proposals.
"""

from __future__ import annotations

from collections.abc import Sequence

from sweep.search.strategies import Seen, Strategy, searches, strategy
from sweep.search.warm_start import indices_of
from sweep.spec.search_options import SearchOptions
from sweep.spec.space import Space


def search_strategy(space: Space, options: SearchOptions, batch: int,
                    warm: Sequence[int] = ()) -> Strategy:
    """The strategy of a run's search: per problem in a sweep over problems."""
    if len(space.starts) > 1:
        return PerProblem(space, options, batch, warm)
    return strategy(space, options, batch, warm)


class PerProblem:
    """A Strategy whose batches join those of a strategy per problem (indices are the
    sweep's; each problem's strategy proposes in its part's own). warm: the cache's
    configs (the sweep's indices), for the problems they fall in."""

    def __init__(self, space: Space, options: SearchOptions, batch: int,
                 warm: Sequence[int] = ()) -> None:
        self.space, self.options, self.batch = space, options, batch
        self.parts = [space.part(p) for p in range(len(space.starts))]
        self.ranges = [space.problem_range(p) for p in range(len(space.starts))]
        self.cached: list[list[int]] = [[] for _ in self.ranges]
        for i in warm:
            self.cached[space.problem_of(i)].append(i - space.starts[space.problem_of(i)])
        self.strategies: list[Strategy | None] = [None] * len(self.parts)
        # The batch at which each problem's search began, and at which it ended (it
        # proposed None): its batches are the sweep's in between.
        self.began: list[int | None] = [None] * len(self.parts)
        self.ended: list[int | None] = [None] * len(self.parts)

    def propose(self, seen: Seen, batches: Sequence[Sequence[int]],
                taken: set[int]) -> list[int] | None:
        k = len(batches)
        # Each problem's share of seen, taken and the batches, in its own indices: sorted
        # out once a call, not once per problem (a sweep may hold 10,000 problems).
        own_seen: dict[int, dict[int, float | None]] = {}
        for i, v in seen.items():
            p = self.space.problem_of(i)
            own_seen.setdefault(p, {})[i - self.ranges[p].start] = v
        own_taken: dict[int, set[int]] = {}
        for i in taken:
            p = self.space.problem_of(i)
            own_taken.setdefault(p, set()).add(i - self.ranges[p].start)
        first = min((b for b in self.began if b is not None), default=k)
        own_batches: dict[int, dict[int, list[int]]] = {}
        for j in range(first, k):
            for i in batches[j]:
                p = self.space.problem_of(i)
                own_batches.setdefault(p, {}).setdefault(j, []).append(
                    i - self.ranges[p].start)
        out: list[int] = []
        going = False
        for p, at in enumerate(self.ranges):
            ended = self.ended[p]
            if ended is not None and ended < k:
                continue
            if self.strategies[p] is None:
                warm = self._warm(p, own_seen.get(p - 1, {}), own_taken.get(p - 1, set()))
                if warm is None:  # waits for its neighbour
                    going = True
                    continue
                self.strategies[p] = strategy(self.parts[p], self.options, self.batch, warm)
                self.began[p] = k
            mine = self.strategies[p]
            assert mine is not None
            began = self.began[p] or 0
            by_batch = own_batches.get(p, {})
            local = mine.propose(own_seen.get(p, {}),
                                 [by_batch.get(j, []) for j in range(began, k)],
                                 own_taken.get(p, set()))
            if local is None:
                self.ended[p] = k
                continue
            going = True
            out += [i + at.start for i in local]
        return out if going else None

    def _warm(self, p: int, seen_before: Seen, taken_before: set[int]) -> list[int] | None:
        """The first configs of problem p's search (its own indices), or None while it
        waits: the cache's, else the neighbour before it's fastest that worked (once one
        has, or the neighbour is over with nothing that worked). seen_before and
        taken_before: the neighbour's, in its own indices."""
        # Halving proposes one sample, and a space too small to search all its configs:
        # waiting for a neighbour's would run them in turn.
        if p == 0 or self.cached[p] or self.options.warm_start <= 0 or \
                self.options.strategy == "halving" or \
                not searches(self.options, len(self.parts[p])):
            return self.cached[p]
        before = self.ranges[p - 1]
        ok = sorted((v, i) for i, v in seen_before.items() if v is not None)
        over = self.ended[p - 1] is not None and all(i in seen_before for i in taken_before)
        if not ok and not over:
            return None
        configs = [self.space.kernel_config(i + before.start)
                   for _, i in ok[:self.options.warm_start]]
        return indices_of(self.parts[p], configs)
