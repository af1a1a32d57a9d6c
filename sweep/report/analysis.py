"""What a run directory says, computed once for every view of it: the text report and its
JSON (text.py), the HTML page (html.py) and the PNGs (plots.py) only render these records.

Reads only what a run writes for readers (trials.parquet, best.json, snapshot.json), never
the lock: a run that is still going is read from its checkpointed table.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.backends import BACKENDS
from storage.readback import is_regular
from storage.records import PRUNED
from sweep.report.timeline import Span, WorkerUse, retiming, worker_timeline
from sweep.results.errors import ErrorGroup, common_errors

# A trial's columns that the HTML report's table and timeline carry (besides parameters).
TRIAL_COLUMNS = ("index", "status", "latency_ms", "latency_p20_ms", "latency_p80_ms",
                 "validation", "error", "compile_ms", "device", "node", "worker", "attempt")


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
class Analysis:
    path: str
    name: str
    state: str
    kernel: str
    backend: str
    total: int  # configs in the space
    done: int  # trials recorded
    counts: dict[str, int]
    errors: list[ErrorGroup]  # every failure, grouped by cause, commonest first
    winner: int | None  # best.json's (the snapshot's while a run is going)
    partial: bool  # the winner is not a complete run's settled pick
    ranked: list[Ranked]  # every ok trial
    baseline: list[Baseline]
    work: dict[str, float]  # flops / bytes_moved per launch, where the kernel says
    parameters: list[str]
    effects: list[Effect]
    heatmaps: list[Heatmap]  # every pair of parameters that take two values or more
    workers: list[WorkerUse]
    spans: list[Span]
    trials: list[dict[str, Any]]  # every trial as the HTML table shows it (see _trials)
    sessions: int
    fingerprint: str
    spec: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)

    def top(self, k: int) -> list[Ranked]:
        return self.ranked[:k]

    @property
    def interpreted(self) -> bool:
        """The trials ran under Triton's CPU interpreter, which ignores launch options."""
        known = BACKENDS.get(self.backend)
        return (known is not None and known.interpreted) or "cpu-interpreter" in self.devices

    def default_heatmap(self) -> Heatmap | None:
        """The heatmap a reader sees first (the HTML page's default pick, the PNG): the
        first pair of parameters; under the interpreter, the first of those with the
        fewest launch options (num_warps and the like change nothing there)."""
        if not self.heatmaps or not self.interpreted:
            return self.heatmaps[0] if self.heatmaps else None
        from sweep.spec import LAUNCH_OPTIONS

        return min(self.heatmaps, key=lambda m: (m.x in LAUNCH_OPTIONS) + (m.y in LAUNCH_OPTIONS))

    @property
    def chosen(self) -> Ranked | None:
        """The winner's row (ranked first, where a winner is recorded)."""
        return next((r for r in self.ranked if r.winner), None)

    def summary(self, top: int) -> dict[str, Any]:
        """The JSON a script reads (`sweep report --json`): everything but the per-trial
        timeline, and the top `top` of the ranking."""
        from dataclasses import asdict, replace

        doc = asdict(replace(self, spans=[], trials=[], ranked=self.ranked[:top]))
        del doc["spans"], doc["trials"]
        doc["top"] = doc.pop("ranked")
        return doc


def analyse(path: Path) -> Analysis:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.run.rundir import RunDir
    from sweep.spec import SpecError

    run = RunDir(path)
    if not path.exists():
        raise SpecError(f"{path}: no such run directory")
    if not path.is_dir():
        raise SpecError(f"{path}: not a run directory (a file)")
    if not run.meta.exists() and not run.trials.exists():
        raise SpecError(f"{path}: not a sweep run directory (no run.json)")
    if not run.trials.exists():
        raise SpecError(f"{path}: no trials.parquet yet (a run writes it every few seconds; "
                        "resume a stopped one to build it)")
    if not is_regular(run.trials):  # pyarrow would block on a FIFO
        raise SpecError(f"{run.trials}: not a regular file")
    from storage.table import table_problem

    try:
        table = pq.read_table(run.trials)
        problem = table_problem(table.schema)
        if problem is not None:
            raise ValueError(f"not a trial table: {problem}")
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        spec = json.loads(meta.get("spec", "{}"))
        versions = json.loads(meta.get("versions", "{}"))
        devices = json.loads(meta.get("devices", "[]"))
        if not (isinstance(spec, dict) and isinstance(spec.get("space", {}), dict) and
                isinstance(spec.get("work", {}), dict) and isinstance(versions, dict) and
                isinstance(devices, list)):
            raise ValueError("its metadata is not a run's")
        rows = table.to_pylist()
    except (OSError, ValueError, TypeError, pa.ArrowException) as e:
        raise SpecError(f"{run.trials}: unreadable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''}); "
                          f"resume the run to rebuild it") from None
    fingerprint = meta.get("fingerprint", "")
    pick = _pick(run, fingerprint, meta.get("state", "?"))
    run_meta = _run_meta(run)
    # The table's order, which is the spec's (the spec's JSON sorts its keys).
    parameters = [c for c in table.column_names if c in spec.get("space", {})]
    space = spec.get("space", {})
    # A pruned row is a config the search did not run: no trial, no worker's time.
    ran = [r for r in rows if r["status"] != PRUNED]
    positions = _positions(ran, parameters, space)
    ok = [r for r in ran if r["status"] == "ok"]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    work = {k: float(v) for k, v in spec.get("work", {}).items()}
    ranked = _rank(ok, pick, work)
    sessions = pick.sessions
    first = min((r["started_at"].timestamp() for r in ran), default=0.0)
    t0 = sessions[0] if sessions and sessions[0] <= first else first
    spans, workers = worker_timeline(ran, sessions, t0)
    spans += retiming(pick.timeline, len(sessions), t0)
    return Analysis(
        path=str(path), name=spec.get("name", path.name), state=meta.get("state", "?"),
        # run.json's backend has `auto` resolved; its total counts every config.
        kernel=str(spec.get("kernel", "?")),
        backend=str(run_meta.get("backend", spec.get("backend", "?"))),
        total=run_meta.get("total", pick.total if pick.total is not None else len(rows)),
        done=len(rows),
        counts=dict(sorted(counts.items())),
        errors=common_errors(table.select(["index", "status", "error"]), top=len(rows)),
        winner=pick.winner if any(r.winner for r in ranked) else None,
        partial=pick.partial, ranked=ranked, baseline=_baseline(pick.baseline, ranked),
        work=work,
        parameters=parameters, effects=_effects(ran, positions, space),
        heatmaps=_heatmaps(ran, positions, space), workers=workers,
        spans=spans, trials=_trials(rows, parameters, ranked, t0),
        sessions=max(len(sessions), 1), fingerprint=fingerprint, spec=spec,
        versions=versions, devices=devices)


@dataclass(frozen=True)
class _Pick:
    """What chose the winner: best.json, or the snapshot while a run is going (best.json
    is then an earlier session's) or where best.json is lost or damaged."""

    winner: int | None
    finalists: dict[int, dict[str, float]]  # index -> its re-timing
    settled: set[int]  # each device type's best: re-timed, or the one pass's where not
    baseline: dict[str, dict[str, Any]]
    partial: bool
    sessions: list[float]  # each session's start, where the snapshot knows them
    total: int | None
    timeline: dict[str, float]  # the last session's phases (Snapshot.timeline)


def _pick(run: Any, fingerprint: str, state: str) -> _Pick:
    from storage.snapshot import Snapshot, SnapshotError, read_best, read_snapshot

    try:
        snap: Snapshot | None = read_snapshot(run.snapshot)
    except SnapshotError:
        snap = None
    if snap is not None and snap.fingerprint != fingerprint:
        snap = None
    sessions = _session_starts(snap)
    total = snap.total if snap is not None else None
    timeline = dict(snap.timeline) if snap is not None else {}
    doc = read_best(run.best, fingerprint)
    if doc is not None and (snap is None or snap.state != "running"):
        try:
            return _Pick(
                doc["index"], {int(f["index"]): _timing(f) for f in doc["finalists"]},
                {int(b["index"]) for b in (doc.get("by_device") or {}).values()}
                | ({doc["index"]} if doc["index"] is not None else set()),
                {str(d): {**_timing(t), "of": str(t.get("of", "baseline"))}
                 for d, t in (doc.get("baseline") or {}).items()},
                bool(doc["partial"]) or state != "complete", sessions, total, timeline)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # parses, but not as this tool writes it: the snapshot's account stands
    if snap is None:
        return _Pick(None, {}, set(), {}, True, sessions, total, timeline)
    return _Pick(snap.best.index if snap.best else None,
                 {int(f["index"]): _timing(f) for f in snap.finalists},
                 {b.index for b in snap.by_device.values()},
                 {d: {**_timing(t), "of": t.get("of", "baseline")}
                  for d, t in snap.baseline.items()},
                 snap.state != "complete" or state != "complete", sessions, total, timeline)


def _timing(doc: dict[str, Any]) -> dict[str, float]:
    return {k: float(doc[k]) for k in ("latency_ms", "latency_p20_ms", "latency_p80_ms")}


def _run_meta(run: Any) -> dict[str, Any]:
    """run.json, or nothing where it is missing or damaged (the table and snapshot stand)."""
    from sweep.run.rundir import read_meta
    from sweep.spec import SpecError

    try:
        return read_meta(run)
    except SpecError:
        return {}


def _rank(ok: list[dict[str, Any]], pick: _Pick, work: dict[str, float]) -> list[Ranked]:
    """Each device type's settled best and the finalists (by their re-timing, the one
    pass's where not re-timed), then the rest by the one pass. The winner, the fastest
    settled best, comes first."""
    retimed = pick.finalists

    def key(r: dict[str, Any]) -> tuple[int, float, int]:
        f = retimed.get(r["index"])
        if f is not None:
            return 0, f["latency_ms"], r["index"]
        return (0 if r["index"] in pick.settled else 1), r["latency_ms"], r["index"]

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
            winner=r["index"] == pick.winner))
    return out


def _rate(amount: float | None, ms: float, unit: float) -> float | None:
    return amount / (ms * 1e-3) / unit if amount and ms > 0 else None


def _baseline(timed: dict[str, dict[str, Any]], ranked: list[Ranked]) -> list[Baseline]:
    out = []
    for device, t in sorted(timed.items()):
        on_device = [r for r in ranked if r.device == device]
        if not on_device:
            continue
        best = on_device[0].best_ms  # the ranking's first on the device: its best
        out.append(Baseline(device, t["of"], t["latency_ms"], t["latency_p20_ms"],
                            t["latency_p80_ms"], best, t["latency_ms"] / best))
    return out


def _positions(rows: list[dict[str, Any]], parameters: list[str],
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


def _effects(rows: list[dict[str, Any]], positions: dict[str, list[int | None]],
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


def _heatmaps(rows: list[dict[str, Any]], positions: dict[str, list[int | None]],
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


def _session_starts(snap: Any) -> list[float]:
    if snap is None:
        return []
    if snap.sessions:
        return sorted(s[0] for s in snap.sessions)
    start = snap.timeline.get("session_start")
    return [start] if start else []


def _trials(rows: list[dict[str, Any]], parameters: list[str],
            ranked: list[Ranked], t0: float) -> list[dict[str, Any]]:
    """Every trial as the HTML table shows it, in index order: its parameters and columns,
    the ranking's rank, re-timed latency and throughput, and its times in seconds since
    t0 (the timeline's)."""
    by_index = {r.index: r for r in ranked}
    out = []
    for r in rows:
        k = by_index.get(r["index"])
        out.append({
            **{c: r[c] for c in ("index", *parameters, *TRIAL_COLUMNS[1:])},
            "rank": k.rank if k else None, "retimed_ms": k.retimed_ms if k else None,
            "tflops": k.tflops if k else None, "gbps": k.gbps if k else None,
            "winner": bool(k and k.winner),
            "started_s": r["started_at"].timestamp() - t0,
            "finished_s": r["finished_at"].timestamp() - t0})
    return out
