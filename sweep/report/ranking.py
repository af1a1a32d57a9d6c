"""The records a report is made of (a trial ranked, torch's time beside the best, a
parameter's effect, a heatmap, one problem of a sweep over problems) and how each is
computed from the trial table's rows: for a whole run, or for one problem's rows.
Below analysis.py, which reads a run directory and hands these the rows."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

from storage.best_file import raced_through
from storage.records import PRUNED


@dataclass(frozen=True)
class Ranked:
    """A trial that worked, in the order a reader should take them: the finalists by their
    side-by-side re-timing (which chose the winner), then the rest by the sweep's one pass.
    Every finalist was faster in that pass than every other trial of its device type."""

    rank: int  # 1 = the winner, where best.json agrees
    index: int
    config: dict[str, Any]
    device: str
    latency_ms: float  # the sweep's one pass (the screen, where the spec screens)
    latency_p20_ms: float
    latency_p80_ms: float
    retimed_ms: float | None  # the finalists' re-timing; None for the rest
    retimed_p20_ms: float | None
    retimed_p80_ms: float | None
    tflops: float | None  # from the re-timed latency where there is one
    gbps: float | None
    winner: bool

    @property
    def best_ms(self) -> float:
        return self.retimed_ms if self.retimed_ms is not None else self.latency_ms


@dataclass(frozen=True)
class Baseline:
    """torch doing the kernel's job, timed among the finalists on one device type."""

    device: str
    of: str  # the kernel's "baseline", or its validation "reference" (it has no baseline)
    latency_ms: float
    latency_p20_ms: float
    latency_p80_ms: float
    best_ms: float  # the device's best config, re-timed in the same rotation
    speedup: float  # torch / best: above 1, the tuned kernel is faster than torch


@dataclass(frozen=True)
class ValueEffect:
    value: Any
    trials: int
    ok: int
    median_ms: float | None  # of the ok trials' latencies (one pass each)
    best_ms: float | None


@dataclass(frozen=True)
class Effect:
    parameter: str
    values: list[ValueEffect]


@dataclass(frozen=True)
class Heatmap:
    """The best latency of each pair of values of two parameters; None where none worked."""

    x: str
    y: str
    x_values: list[Any]
    y_values: list[Any]
    best_ms: list[list[float | None]]  # [y][x]

@dataclass(frozen=True)
class Chose:
    """What chose a winner (the run's, or one problem's in a sweep over problems): best.json
    or the snapshot while a run is going."""

    winner: int | None
    finalists: dict[int, dict[str, float]]  # index -> its re-timing
    settled: set[int]  # each device type's best: re-timed, or the one pass's where not
    baseline: dict[str, dict[str, Any]]  # device type -> torch's timing and "of"


NOTHING_CHOSE = Chose(None, {}, set(), {})


@dataclass(frozen=True)
class Problem:
    """One problem of a sweep over problems (`problems:`): its trials, ranked, and what
    the run's are for a sweep of one (the winner, torch's time, each parameter's effect)."""

    label: str  # by the problem keys that vary: "M=16, N=4096"
    problem: dict[str, Any]  # every key, the kernel's defaults merged in
    first_index: int | None  # its first config's index (None: no trial of it recorded)
    configs: int | None  # in its space (None: neither best.json nor the snapshot says)
    done: int  # trials recorded
    counts: dict[str, int]
    winner: int | None
    finalists: int  # re-timed side by side, which chose its winner
    ranked: list[Ranked]  # its ok trials, ranked as a run's are
    baseline: list[Baseline]
    effects: list[Effect]
    heatmaps: list[Heatmap]

    @property
    def chosen(self) -> Ranked | None:
        return next((r for r in self.ranked if r.winner), None)

    def summary(self, top: int) -> dict[str, Any]:
        """As `sweep report --json` gives it: its top `top` and its winner's row."""
        doc = asdict(replace(self, ranked=self.ranked[:top]))
        doc["top"] = doc.pop("ranked")
        chosen = self.chosen
        doc["chosen"] = asdict(chosen) if chosen is not None else None
        return doc


def problem_record(label: str, problem: dict[str, Any], rows: list[dict[str, Any]],
                   chose: Chose, configs: int | None, parameters: list[str],
                   space: dict[str, list[Any]]) -> Problem:
    """One problem's record from its rows (`pruned` ones included). Its throughput is not
    computed: the table's work per launch is the base problem's, not this one's."""
    ran = [r for r in rows if r["status"] != PRUNED]
    ok = [r for r in ran if r["status"] == "ok"]
    ranked = rank_trials(ok, chose, {})
    at = value_positions(ran, parameters, space)
    return Problem(
        label=label, problem=problem, first_index=min((r["index"] for r in rows), default=None),
        configs=configs, done=len(rows), counts=count_statuses(rows),
        winner=chose.winner if any(r.winner for r in ranked) else None,
        finalists=len(chose.finalists), ranked=ranked,
        baseline=baselines(chose.baseline, ranked), effects=effects_of(ran, at, space),
        heatmaps=heatmaps_of(ran, at, space))



def count_statuses(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many rows have each status, by status."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return dict(sorted(counts.items()))


def rank_trials(ok: list[dict[str, Any]], chose: Chose, work: dict[str, float]) -> list[Ranked]:
    """Each device type's settled best and the finalists (by their re-timing, the one
    pass's where not re-timed; those timed in fewer rounds after), then the rest by the
    one pass. The winner, the fastest settled best, comes first."""
    retimed = chose.finalists
    # A finalist that sat out the later rounds ranks after those timed in all of them.
    full = dict(zip(retimed, raced_through([f.get("rounds") for f in retimed.values()])))

    def key(r: dict[str, Any]) -> tuple[int, int, float, int]:
        f = retimed.get(r["index"])
        if f is not None:
            return 0, int(not full[r["index"]]), f["latency_ms"], r["index"]
        return (0 if r["index"] in chose.settled else 1), 0, r["latency_ms"], r["index"]

    out = []
    for rank, r in enumerate(sorted(ok, key=key), 1):
        f = retimed.get(r["index"])
        ms = f["latency_ms"] if f else r["latency_ms"]
        out.append(Ranked(
            rank=rank, index=r["index"], config=json.loads(r["config"]), device=r["device"],
            latency_ms=r["latency_ms"], latency_p20_ms=r["latency_p20_ms"],
            latency_p80_ms=r["latency_p80_ms"],
            retimed_ms=f["latency_ms"] if f else None,
            retimed_p20_ms=f["latency_p20_ms"] if f else None,
            retimed_p80_ms=f["latency_p80_ms"] if f else None,
            tflops=_rate(work.get("flops"), ms, 1e12), gbps=_rate(work.get("bytes_moved"), ms, 1e9),
            winner=r["index"] == chose.winner))
    return out


def _rate(amount: float | None, ms: float, unit: float) -> float | None:
    return amount / (ms * 1e-3) / unit if amount and ms > 0 else None


def baselines(timed: dict[str, dict[str, Any]], ranked: list[Ranked]) -> list[Baseline]:
    out = []
    for device, t in sorted(timed.items()):
        on_device = [r for r in ranked if r.device == device]
        if not on_device:
            continue
        best = on_device[0].best_ms  # the ranking's first on the device: its best
        out.append(Baseline(device, t["of"], t["latency_ms"], t["latency_p20_ms"],
                            t["latency_p80_ms"], best, t["latency_ms"] / best))
    return out


def value_positions(rows: list[dict[str, Any]], parameters: list[str],
               space: dict[str, list[Any]]) -> dict[str, list[int | None]]:
    """Each row's value of each parameter as its position in the spec's list (None: not
    in it), computed once for the effects and every heatmap."""
    out: dict[str, list[int | None]] = {}
    for p in parameters:
        values = space[p]
        seen: dict[tuple[type, Any], int | None] = {}
        column = []
        for r in rows:
            v = r[p]
            key = (type(v), v)
            if key not in seen:
                seen[key] = _position(values, v)
            column.append(seen[key])
        out[p] = column
    return out


def effects_of(rows: list[dict[str, Any]], positions: dict[str, list[int | None]],
             space: dict[str, list[Any]]) -> list[Effect]:
    out = []
    for p, column in positions.items():
        trials = [0] * len(space[p])
        latencies: list[list[float]] = [[] for _ in space[p]]
        for r, at in zip(rows, column):
            if at is None:
                continue
            trials[at] += 1
            if r["status"] == "ok":
                latencies[at].append(r["latency_ms"])
        out.append(Effect(p, [
            ValueEffect(v, n, len(lat), statistics.median(lat) if lat else None,
                        min(lat) if lat else None)
            for v, n, lat in zip(space[p], trials, latencies)]))
    return out


def heatmaps_of(rows: list[dict[str, Any]], positions: dict[str, list[int | None]],
              space: dict[str, list[Any]]) -> list[Heatmap]:
    varied = [p for p in positions if len(space[p]) > 1]
    ok = [i for i, r in enumerate(rows) if r["status"] == "ok"]
    out = []
    for i, x in enumerate(varied):
        for y in varied[i + 1:]:
            grid: list[list[float | None]] = [[None] * len(space[x]) for _ in space[y]]
            for k in ok:
                col, row = positions[x][k], positions[y][k]
                if col is None or row is None:
                    continue
                ms, seen = rows[k]["latency_ms"], grid[row][col]
                grid[row][col] = ms if seen is None else min(seen, ms)
            out.append(Heatmap(x, y, list(space[x]), list(space[y]), grid))
    return out


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python, but a parameter's True and 1 are different values.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _position(values: list[Any], value: Any) -> int | None:
    return next((i for i, v in enumerate(values) if _same(value, v)), None)

