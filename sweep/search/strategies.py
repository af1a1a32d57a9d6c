"""What to try: the strategies that decide which configs of a space a sweep compiles and
times, and which it leaves `pruned` (spec key `search`; the default, exhaustive, runs all).

A strategy's proposals are a pure function of its options, the space and the outcomes of
the batches it proposed before. So every row of a searched run follows from its journal
alone: a resumed run replays the proposals from the journal and arrives at the batch it
was on (exactly-once, the same decisions as uninterrupted), and an offline replay of a
recorded table (benchmarks/search.py) makes the very decisions a run would.

Proposals are pipelined one batch deep: batch k is decided from the outcomes of batches
0..k-2, so while batch k-1 finishes, batch k is already queued and no GPU waits on a
decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from storage.records import TrialRecord
from sweep.spec.search_options import SearchOptions
from sweep.spec.space import Space

LAG = 1  # batches in flight while the next is decided (see the module's docstring)
POOL = 5_000  # candidates a guided search scores per batch, at most (and neighbours)
ENSEMBLE = 8  # bootstrap fits whose spread is the model's uncertainty
RIDGE = 1.0  # the fits' L2 penalty, per feature
# Configs sampled before the model guides: a spread sample the model can learn from (it
# was once tied to the compile limit's sample count, which has since dropped to 8).
INITIAL = 60
MAX_PAIR_VALUES = 256  # value combinations of a pair of parameters the model learns, at most
DEFAULT_BUDGET = SearchOptions().budget  # guided's, for a space too small to search


@dataclass(frozen=True)
class SearchPlan:
    """What a search decided when its run was created, and must decide the same on every
    resume (another cluster's size, a cache changed meanwhile): run.json's `search`."""

    batch: int  # configs per batch
    warm: tuple[int, ...] = ()  # the warm start's configs, to run first
    warm_from: str | None = None  # the run directory they came from

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "warm": list(self.warm), "warm_from": self.warm_from}

    @classmethod
    def from_json(cls, doc: Any, total: int) -> SearchPlan:
        """Raises ValueError for anything but a plan for a space of `total` configs."""
        def count(v: Any, low: int) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= low

        if not (isinstance(doc, dict) and count(doc.get("batch"), 1) and
                isinstance(doc.get("warm"), list) and
                all(count(i, 0) and i < total for i in doc["warm"]) and
                isinstance(doc.get("warm_from"), (str, type(None)))):
            raise ValueError("search: a value of the wrong type")
        return cls(doc["batch"], tuple(doc["warm"]), doc["warm_from"])


Seen = Mapping[int, "float | None"]  # index -> latency (ms); None: it did not work


class Strategy(Protocol):
    def propose(self, seen: Seen, batches: Sequence[Sequence[int]],
                taken: set[int]) -> list[int] | None:
        """Batch k = len(batches): indices not in `taken` (those of `batches`), from the
        outcomes of batches 0..k-2 (`seen`); None: the search is over. A pure function
        of its arguments."""
        ...


def outcome(record: TrialRecord) -> float | None:
    return record.latency_ms if record.status == "ok" else None


class Search:
    """Replays a strategy's proposals against what is known, and proposes on as outcomes
    come in. known: every recorded outcome (a resumed run's journal)."""

    def __init__(self, strategy: Strategy, known: Mapping[int, float | None]) -> None:
        self.strategy = strategy
        self.known: dict[int, float | None] = dict(known)
        self.batches: list[list[int]] = []
        self.taken: set[int] = set()
        self.ended = False

    def observe(self, records: Iterable[TrialRecord]) -> None:
        for r in records:
            self.known[r.index] = outcome(r)

    def advance(self) -> list[int]:
        """Propose every batch whose inputs are all known; returns their configs that
        have no outcome yet, in order (to run)."""
        new: list[int] = []
        while not self.ended:
            k = len(self.batches)
            inputs = [i for b in self.batches[:max(0, k - LAG)] for i in b]
            if any(i not in self.known for i in inputs):
                break
            batch = self.strategy.propose({i: self.known[i] for i in inputs}, self.batches,
                                          self.taken)
            if batch is None:
                self.ended = True
                break
            self.batches.append(batch)
            self.taken.update(batch)
            new += [i for i in batch if i not in self.known]
        return new

    def settled(self) -> bool:
        """Over, with an outcome for everything it proposed: the rest are pruned."""
        return self.ended and all(i in self.known for i in self.taken)

    def pruned(self, total: int) -> list[int]:
        """Configs with no outcome once the search is settled."""
        return [i for i in range(total) if i not in self.known]


def first_sample(options: SearchOptions) -> int:
    """The configs a search runs before what it learnt can steer it: guided's first
    batch, a seeded spread sample (Guided.propose); halving's first rung is a seeded sample
    of its own, held to the same size. From the spec alone (its batch, never the
    cluster's), like everything searches() decides."""
    return max(INITIAL, options.batch or 0)


def searches(options: SearchOptions, total: int) -> bool:
    """Whether a search of a space of `total` configs runs a part of it. A budget that
    ends within the first sample picks the best of a seeded sample, no search at all (on
    configs/matmul.yaml's 64 configs, up to 23% slower than the best; BENCHMARKS.md):
    on such a space every config runs instead. Not where only the spec's own budget is
    that small, on a space the default budget searches past its first sample: there the
    sample is what was asked for. A function of the spec and the space alone, so every
    resume decides as the run's start did."""
    budget = options.budget_configs(total)
    first = first_sample(options)
    return budget is not None and (budget > first or total * DEFAULT_BUDGET > first)


def most(options: SearchOptions, sizes: int | Sequence[int]) -> int | None:
    """The configs a run's search runs at most (None: all), given each problem's count of
    configs (a search each, in a sweep over problems)."""
    each = [sizes] if isinstance(sizes, int) else list(sizes)
    if not any(searches(options, n) for n in each):
        return None
    return sum(options.budget_configs(n) or n if searches(options, n) else n for n in each)


def strategy(space: Space, options: SearchOptions, batch: int,
             warm: Sequence[int] = ()) -> Strategy:
    if not searches(options, len(space)):
        return Everything(len(space))
    if options.strategy == "halving":
        return Halving(space, options, warm)
    if options.strategy == "guided":
        return Guided(space, options, batch, warm)
    raise ValueError(f"no strategy {options.strategy!r} to propose batches")


class Everything:
    """A space too small to search (see searches()): every config, in one batch. The
    session orders them to compile, heaviest first, as it does any batch."""

    def __init__(self, total: int) -> None:
        self.total = total

    def propose(self, seen: Seen, batches: Sequence[Sequence[int]],
                taken: set[int]) -> list[int] | None:
        return None if batches else [i for i in range(self.total) if i not in taken]


def batch_size(options: SearchOptions, workers: int, compile_workers: int) -> int:
    """Configs per batch: the spec's, or enough that every GPU (and each GPU's compile
    pool, a config per process) has work while the next batch is decided."""
    if options.batch is not None:
        return options.batch
    return max(1, workers) * max(8, compile_workers)


def _sample(space: Space, n: int, rng: np.random.Generator, taken: set[int],
            first: Sequence[int] = ()) -> list[int]:
    """`first` (not taken), then configs drawn without replacement."""
    out = [i for i in dict.fromkeys(first) if i not in taken][:n]
    chosen = set(out) | taken
    if len(out) < n:
        for i in rng.permutation(len(space)).tolist():
            if i not in chosen:
                out.append(i)
                chosen.add(i)
                if len(out) == n:
                    break
    return out


class Halving:
    """Successive halving: the first rung is a sample of the space, screened on every GPU
    at once; the session then promotes 1/eta of each rung to the careful timing, across
    every GPU, down to the finalists (sweep/run/finish.py). The rest are pruned."""

    def __init__(self, space: Space, options: SearchOptions, warm: Sequence[int] = ()) -> None:
        self.space, self.options, self.warm = space, options, list(warm)

    def propose(self, seen: Seen, batches: Sequence[Sequence[int]],
                taken: set[int]) -> list[int] | None:
        if batches:
            return None
        n = max(1, math.ceil(self.options.sample * len(self.space)))
        return _sample(self.space, n, np.random.default_rng(self.options.seed), taken,
                       self.warm)


def rungs(n: int, eta: int, keep: int) -> list[int]:
    """How many of halving's n screened configs each later rung re-times carefully (1/eta
    of the one before), before the last `keep` go to the finalists' side-by-side
    re-timing: 400 configs, eta 3, 5 finalists: [134, 45, 15]."""
    sizes: list[int] = []
    while True:
        n = max(keep, math.ceil(n / eta))
        if n <= keep:
            return sizes
        sizes.append(n)


class Guided:
    """A model-guided batch search. The model: log latency as a sum of each parameter's
    and each pair of parameters' value effects (ridge regression on one-hot features),
    fitted on bootstrap resamples whose spread stands for its uncertainty; and one fit of
    the same form for the chance that a config fails. Each batch takes the untried
    neighbours of the best three (one step in one parameter; in one or two for the best)
    that the model ranks highest, up to half the batch, then the untried configs with
    the lowest optimistic prediction (mean less the spread, plus the failure risk). The
    first two batches are a spread sample (the warm start's configs first)."""

    def __init__(self, space: Space, options: SearchOptions, batch: int,
                 warm: Sequence[int] = ()) -> None:
        self.space, self.options, self.batch, self.warm = space, options, batch, list(warm)
        self.limit = max(1, math.ceil(options.budget * len(space)))
        # A parameter some configs leave unset has that as a value of its own (levels).
        levels = {n: space.levels(n) for n in space.names}
        self.varied = [n for n in space.names if levels[n][1] > 1]
        self.codes = {n: levels[n][0] for n in self.varied}
        # Each config's position in the product of the varied parameters' value lists:
        # ascending for a product, so a neighbour is a binary search (through `order`,
        # which sorts them, for an explicit list of configs).
        self.sizes = sizes = [levels[n][1] for n in self.varied]
        self.strides = [math.prod(sizes[k + 1:]) for k in range(len(sizes))]
        self.keys = np.zeros(len(space), dtype=np.int64)
        for n, stride in zip(self.varied, self.strides):
            self.keys += self.codes[n].astype(np.int64) * stride
        self.order = None if bool(np.all(self.keys[1:] > self.keys[:-1])) else \
            np.argsort(self.keys, kind="stable")
        self.sorted_keys = self.keys if self.order is None else self.keys[self.order]
        # Pairs of parameters whose joint effects the model learns; a pair of long value
        # lists would make more features than a search has trials to fit them.
        self.pairs = [(a, b) for a in range(len(sizes)) for b in range(a + 1, len(sizes))
                      if sizes[a] * sizes[b] <= MAX_PAIR_VALUES]
        rng = np.random.default_rng(options.seed)
        # The candidates: the whole space, or a fixed sample of a large one (neighbours
        # of the best are added each time).
        self.pool = np.arange(len(space)) if len(space) <= POOL else \
            np.sort(rng.choice(len(space), POOL, replace=False))

    def propose(self, seen: Seen, batches: Sequence[Sequence[int]],
                taken: set[int]) -> list[int] | None:
        k = len(batches)
        # The first batch is a spread sample large enough for the run's compile limit to
        # be learnt from it (a compile hanging in it otherwise holds every decision until
        # the fixed limit; see sweep/search/scheduling.py), and for a first model.
        size = max(self.batch, INITIAL) if k == 0 else self.batch
        room = min(size, self.limit - len(taken), len(self.space) - len(taken))
        if room <= 0 or (k > LAG and self._stalled(seen, batches)):
            return None
        rng = np.random.default_rng([self.options.seed, k])
        if k <= LAG or not any(v is not None for v in seen.values()):
            return _sample(self.space, room, rng, taken, self.warm)
        return self._guided(room, seen, taken, rng)

    def _stalled(self, seen: Seen, batches: Sequence[Sequence[int]]) -> bool:
        """The batches of the last `patience` of the space improved the best by less than
        `improvement`."""
        bests, best = [], math.inf  # the best after each batch whose outcomes are seen
        for batch in batches[:len(batches) - LAG]:
            best = min([best, *(v for i in batch if (v := seen.get(i)) is not None)])
            bests.append(best)
        p = max(2, math.ceil(self.options.patience * len(self.space) / self.batch))
        if len(bests) <= p:
            return False
        return not bests[-1] < bests[-p - 1] * (1 - self.options.improvement)

    def _features(self, indices: np.ndarray) -> np.ndarray:
        codes = [self.codes[n][indices].astype(np.int64) for n in self.varied]
        sizes = self.sizes
        columns, offset = [], 0
        for c, s in zip(codes, sizes):
            columns.append(offset + c)
            offset += s
        for a, b in self.pairs:
            columns.append(offset + codes[a] * sizes[b] + codes[b])
            offset += sizes[a] * sizes[b]
        x = np.zeros((len(indices), offset), dtype=np.float32)
        rows = np.arange(len(indices))
        for col in columns:
            x[rows, col] = 1.0
        return x

    def _neighbours(self, index: int, reach: int = 1) -> list[int]:
        """Configs one step away in one parameter's value list, or (reach 2) in one or
        two: a better tile is often a step up in one dimension and down in another."""
        moves: list[int] = []  # key offsets of single steps, by parameter
        single: list[list[int]] = []
        for n, stride, size in zip(self.varied, self.strides, self.sizes):
            code = int(self.codes[n][index])
            steps = [step * stride for step in (-1, 1) if 0 <= code + step < size]
            single.append(steps)
            moves += steps
        if reach > 1:
            for a in range(len(single)):
                for b in range(a + 1, len(single)):
                    moves += [x + y for x in single[a] for y in single[b]]
        out = []
        keys = self.sorted_keys
        for move in moves:
            key = int(self.keys[index]) + move
            at = int(np.searchsorted(keys, key))
            if at < len(keys) and keys[at] == key:  # not constrained away
                out.append(at if self.order is None else int(self.order[at]))
        return out

    def _guided(self, room: int, seen: Seen, taken: set[int],
                rng: np.random.Generator) -> list[int]:
        done = np.array(sorted(seen), dtype=np.int64)
        lat = np.array([seen[i] if seen[i] is not None else np.nan for i in done.tolist()])
        ok = ~np.isnan(lat)
        ranked = done[ok][np.lexsort((done[ok], lat[ok]))]
        # The best three's untried neighbours: candidates, and (below) up to half the batch.
        local: list[int] = []
        for rank, i in enumerate(ranked[:3].tolist()):
            local += [j for j in self._neighbours(i, 2 if rank == 0 else 1)
                      if j not in taken and j not in local]
        candidates = np.array(sorted(set(self.pool.tolist()) - taken | set(local)),
                              dtype=np.int64)
        if len(candidates) == 0:
            return local[:room]
        # Rounded: a near-tie decided by the last bits of a solve could fall the other
        # way on another machine's BLAS.
        score = np.round(self._score(done, lat, ok, candidates, rng), 6)
        order = candidates[np.lexsort((candidates, score))]
        by_score = {int(i): float(s) for i, s in zip(candidates, score)}
        # At most half the batch goes to neighbours, the most promising of them.
        local = sorted(local, key=lambda j: (by_score.get(j, math.inf), j))[:room // 2]
        picked = list(local)
        chosen = set(picked)
        for i in order.tolist():
            if len(picked) >= room:
                break
            if i not in chosen:
                picked.append(i)
                chosen.add(i)
        return picked

    def _score(self, done: np.ndarray, lat: np.ndarray, ok: np.ndarray,
               candidates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x = self._features(done)
        xc = self._features(candidates)
        y = np.log(lat[ok])
        fail = (~ok).astype(np.float64)
        preds = []
        for _ in range(ENSEMBLE):
            pick = rng.integers(0, len(done), len(done))
            sub = pick[ok[pick]]
            if len(sub) >= 2:
                preds.append(_fit(x[sub], np.log(lat[sub]), xc))
        if not preds:  # too few that worked to fit: the fit on all of them
            preds.append(_fit(x[ok], y, xc))
        mean, spread = np.mean(preds, axis=0), np.std(preds, axis=0)
        # The failure model ranks, it does not explore: one fit on everything.
        risk = np.clip(_fit(x, fail, xc), 0.0, 1.0)
        # A config that likely fails costs a compile for nothing: it ranks as one that
        # would be slower by its risk (in log latency, doubling at certainty).
        return mean - spread + risk * math.log(2)


def _fit(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Ridge regression of y on x (mean of y as intercept), predicted at `at`. With fewer
    trials than features (a large space's first batches), in its dual form: a system as
    large as the trials, not the features."""
    mean = float(np.mean(y))
    x64 = x.astype(np.float64)
    if len(x) < x.shape[1]:
        alpha = np.linalg.solve(x64 @ x64.T + RIDGE * np.eye(len(x)), y - mean)
        w = x64.T @ alpha
    else:
        w = np.linalg.solve(x64.T @ x64 + RIDGE * np.eye(x.shape[1]), x64.T @ (y - mean))
    return at @ w + mean
