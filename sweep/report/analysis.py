"""What a run directory says, computed once for every view of it: the text report and its
JSON (text.py), the HTML page (html.py) and the PNGs (plots.py) only render these records.

Reads only what a run writes for readers (trials.parquet, best.json, snapshot.json), never
the lock: a run that is still going is read from its checkpointed table. A sweep over
problems (`problems:`) is read a problem at a time as well: each one's winner, ranking and
effects (Analysis.problems), the run's own fields then being its first problem's, as
best.json's are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors.backends import BACKENDS
from storage.readback import ReadBackError
from storage.records import PRUNED
from sweep.report.ranking import (
    NOTHING_CHOSE,
    Baseline,
    Chose,
    Effect,
    Heatmap,
    Problem,
    Ranked,
    baselines,
    count_statuses,
    effects_of,
    heatmaps_of,
    problem_record,
    rank_trials,
    value_positions,
)
from sweep.report.timeline import Span, WorkerUse, retiming, worker_timeline
from sweep.results.errors import ErrorGroup, common_errors

# A trial's columns that the HTML report's table and timeline carry (besides parameters).
TRIAL_COLUMNS = ("index", "status", "latency_ms", "latency_p20_ms", "latency_p80_ms",
                 "validation", "error", "compile_ms", "device", "node", "worker", "attempt")


@dataclass(frozen=True)
class Analysis:
    """A run as every view reads it. In a sweep over problems, `ranked` holds each
    problem's ranking in turn (a rank counts within its problem), and `winner`,
    `baseline`, `effects` and `heatmaps` are the first problem's, as best.json's head is;
    `problems` has each one's."""

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
    problem_keys: list[str] = field(default_factory=list)  # the problem keys that vary
    problems: list[Problem] = field(default_factory=list)  # empty: a sweep of one problem
    # The finalists were re-timed side by side; False where the one pass chose (the
    # interpreter, whose timings say nothing of a GPU's).
    retimed: bool = True

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

    def winner_changes(self) -> list[str]:
        """The parameters whose winning value is not the same for every problem that has
        a winner, in the table's order: what tuning per problem buys."""
        configs = [p.chosen.config for p in self.problems if p.chosen is not None]
        return [k for k in self.parameters
                if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]

    def summary(self, top: int) -> dict[str, Any]:
        """The JSON a script reads (`sweep report --json`): everything but the per-trial
        timeline, and the top `top` of the ranking (in a sweep over problems, the first
        problem's; `problems` has each one's, its own top `top` with it)."""
        from dataclasses import asdict

        head = self.problems[0].ranked if self.problems else self.ranked
        doc = asdict(replace(self, spans=[], trials=[], ranked=head[:top], problems=[]))
        del doc["spans"], doc["trials"]
        doc["top"] = doc.pop("ranked")
        if self.problems:
            doc["problems"] = [p.summary(top) for p in self.problems]
        else:  # a sweep of one problem: its JSON as before problems existed
            del doc["problems"], doc["problem_keys"]
        return doc


def analyse(path: Path) -> Analysis:
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
    table, rows, meta, spec, versions, devices = _read_table(run.trials)
    fingerprint = meta.get("fingerprint", "")
    pick = _pick(run, fingerprint, meta.get("state", "?"))
    run_meta = _run_meta(run)
    # The table's order, which is the spec's (the spec's JSON sorts its keys).
    parameters = [c for c in table.column_names if c in spec.get("space", {})]
    space = spec.get("space", {})
    # A pruned row is a config the search did not run: no trial, no worker's time.
    ran = [r for r in rows if r["status"] != PRUNED]
    keys, problems, problem_at = _problems(rows, table.column_names, spec, pick, parameters)
    # The table's work per launch is the base problem's: no rate for a sweep over problems.
    work = {} if problems else {k: float(v) for k, v in spec.get("work", {}).items()}
    if problems:  # each ranked on its own; the run's head is the first's, as best.json's
        ranked = [r for p in problems for r in p.ranked]
        head = problems[0]
        winner, baseline, effects, heatmaps = \
            head.winner, head.baseline, head.effects, head.heatmaps
    else:
        ranked = rank_trials([r for r in ran if r["status"] == "ok"], pick.chose, work)
        at = value_positions(ran, parameters, space)
        winner = pick.winner if any(r.winner for r in ranked) else None
        baseline, effects, heatmaps = baselines(pick.baseline, ranked), \
            effects_of(ran, at, space), heatmaps_of(ran, at, space)
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
        done=len(rows), counts=count_statuses(rows),
        errors=common_errors(table.select(["index", "status", "error"]), top=len(rows)),
        winner=winner, partial=pick.partial, ranked=ranked, baseline=baseline, work=work,
        parameters=parameters, effects=effects, heatmaps=heatmaps, workers=workers,
        spans=spans, trials=_trials(rows, [*keys, *parameters], ranked, t0, problem_at),
        sessions=max(len(sessions), 1), fingerprint=fingerprint, spec=spec,
        versions=versions, devices=devices, problem_keys=keys, problems=problems,
        retimed=not pick.one_pass)


def _read_table(path: Path) -> tuple[Any, list[dict[str, Any]], dict[str, str],
                                     dict[str, Any], dict[str, str], list[str]]:
    """The trial table, its rows, its metadata, and the spec, versions and devices it
    records."""
    import pyarrow as pa

    from storage.table import read_parquet, table_problem
    from sweep.spec import SpecError

    try:
        table = read_parquet(path)
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
    except ReadBackError as e:  # a FIFO or another special file: named as such
        raise SpecError(str(e)) from None
    except (OSError, ValueError, TypeError, pa.ArrowException) as e:
        raise SpecError(f"{path}: unreadable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''}); "
                          f"resume the run to rebuild it") from None
    return table, rows, meta, spec, versions, devices


def _problems(rows: list[dict[str, Any]], columns: list[str], spec: dict[str, Any],
              pick: _Pick, parameters: list[str]
              ) -> tuple[list[str], list[Problem], list[int | None]]:
    """In a sweep over problems (the spec's `problems`, two or more): the problem keys
    that vary (each a column of the table), each problem's record, and each row's problem
    (its position in `problems`). Nothing for a sweep of one problem."""
    listed = spec.get("problems")
    if not (isinstance(listed, list) and len(listed) > 1 and
            all(isinstance(p, dict) for p in listed)):
        return [], [], []
    names = dict.fromkeys(k for p in listed for k in p)  # each key's values read once
    varying = {k for k in names if len({_key(q.get(k)) for q in listed}) > 1}
    if not varying or not varying <= set(columns):
        return [], [], []  # not a table this tool wrote for these problems
    keys = [c for c in columns if c in varying]
    where = {tuple(_key(p.get(k)) for k in keys): i for i, p in enumerate(listed)}
    at = [where.get(tuple(_key(r[k]) for k in keys)) for r in rows]
    chosen = pick.problems if len(pick.problems) == len(listed) else \
        [(NOTHING_CHOSE, None)] * len(listed)
    own: list[list[dict[str, Any]]] = [[] for _ in listed]  # each problem's rows
    for r, k in zip(rows, at):
        if k is not None:
            own[k].append(r)
    out = []
    for i, (problem, (chose, configs)) in enumerate(zip(listed, chosen)):
        label = ", ".join(f"{k}={problem.get(k)}" for k in keys)  # as the run's summary says
        out.append(problem_record(label, problem, own[i], chose, configs, parameters,
                                  spec.get("space", {})))
    return keys, out, at


def _key(value: Any) -> tuple[str, Any]:
    """A problem key's value as the table's column and the spec's JSON both give it: a
    number is one whether the column holds it as an integer or a float."""
    if isinstance(value, bool) or value is None:
        return "b", value
    if isinstance(value, (int, float)):
        return "n", float(value)
    return "s", json.dumps(value, sort_keys=True)


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
    # A sweep over problems: what chose each one's winner, and its configs (by_problem).
    problems: list[tuple[Chose, int | None]] = field(default_factory=list)
    one_pass: bool = False  # finalists not re-timed (the interpreter's): the one pass chose

    @property
    def chose(self) -> Chose:
        return Chose(self.winner, self.finalists, self.settled, self.baseline)


def _pick(run: Any, fingerprint: str, state: str) -> _Pick:
    from storage.best_file import read_best
    from storage.snapshot import Snapshot, SnapshotError, read_snapshot

    try:
        snap: Snapshot | None = read_snapshot(run.snapshot)
    except SnapshotError:
        snap = None
    if snap is not None and snap.fingerprint != fingerprint:
        snap = None
    sessions = _session_starts(snap)
    total = snap.total if snap is not None else None
    timeline = dict(snap.timeline) if snap is not None else {}
    # read_best checked every field read here (finalists' and baseline's timings too).
    found = read_best(run.best, fingerprint)
    if found is not None and (snap is None or snap.state != "running"):
        head = found.choice
        chose = _chose(head)
        return _Pick(chose.winner, chose.finalists, chose.settled, chose.baseline,
                     found.partial or state != "complete", sessions, total, timeline,
                     [(_chose(p.choice), p.configs) for p in found.by_problem],
                     _one_pass(head.finalists, *(p.choice.finalists for p in found.by_problem)))
    if snap is None:
        return _Pick(None, {}, set(), {}, True, sessions, total, timeline)
    problems = snap.problems()
    return _Pick(snap.best.index if snap.best else None,
                 _retimed(snap.finalists),
                 {b.index for b in snap.by_device.values()},
                 _baseline(snap.baseline),
                 snap.state != "complete" or state != "complete", sessions, total, timeline,
                 [(_chose(p.choice), p.configs) for p in problems], _one_pass(snap.finalists))


def _chose(choice: Any) -> Chose:
    """What chose a winner (best.json's head, one problem's, the snapshot's problem's)."""
    best = choice.best
    return Chose(best.index if best else None, _retimed(choice.finalists),
                 {b.index for b in choice.by_device.values()}
                 | ({best.index} if best else set()),
                 _baseline(choice.baseline))


def _baseline(baseline: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(d): {**_timing(t), "of": str(t.get("of", "baseline"))}
            for d, t in baseline.items()}


def _retimed(finalists: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """The finalists' re-timing by index, with the rounds it ran where best.json says:
    those re-timed (none on the interpreter)."""
    out: dict[int, dict[str, float]] = {}
    for f in finalists:
        if f.get("retimed") is not False:
            out[int(f["index"])] = _timing(f)
            if type(f.get("rounds")) is int:  # files before racing have none
                out[int(f["index"])]["rounds"] = f["rounds"]
    return out


def _one_pass(*finalists: list[dict[str, Any]]) -> bool:
    """Whether the finalists were listed but not re-timed (on the interpreter)."""
    return any(f.get("retimed") is False for each in finalists for f in each)


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


def _session_starts(snap: Any) -> list[float]:
    if snap is None:
        return []
    if snap.sessions:
        return sorted(s[0] for s in snap.sessions)
    start = snap.timeline.get("session_start")
    return [start] if start else []


def _trials(rows: list[dict[str, Any]], parameters: list[str],
            ranked: list[Ranked], t0: float,
            problem_at: list[int | None]) -> list[dict[str, Any]]:
    """Every trial as the HTML table shows it, in index order: its parameters (a sweep
    over problems': the problem keys that vary first) and columns, the ranking's rank,
    re-timed latency and throughput, its times in seconds since t0 (the timeline's), and
    in a sweep over problems its problem's position ("problem_at")."""
    by_index = {r.index: r for r in ranked}
    out = []
    for n, r in enumerate(rows):
        k = by_index.get(r["index"])
        out.append({
            **({"problem_at": problem_at[n]} if problem_at else {}),
            **{c: r[c] for c in ("index", *parameters, *TRIAL_COLUMNS[1:])},
            "rank": k.rank if k else None, "retimed_ms": k.retimed_ms if k else None,
            "tflops": k.tflops if k else None, "gbps": k.gbps if k else None,
            "winner": bool(k and k.winner),
            "started_s": r["started_at"].timestamp() - t0,
            "finished_s": r["finished_at"].timestamp() - t0})
    return out
