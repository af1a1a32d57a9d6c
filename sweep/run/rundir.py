"""The run directory: what `sweep run` lays down, what `sweep resume` reads back, and how
the public artefacts (trials.parquet, best.json, snapshot.json) are produced from the
journal."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storage.atomic import write_bytes_atomically
from storage.best_file import problem_doc, write_best
from storage.journal import (
    Journal,
    RecordCheck,
    latest_per_index,
    read_journal,
)
from storage.journal_file import LineLog, line_mark
from storage.lines import encode, encode_attempt
from storage.readback import ReadBackError, printable, read_json
from storage.records import TrialRecord
from storage.snapshot import RunState, Snapshot, checksum, write_snapshot
from storage.table import build_table, json_metadata, records_from_table, write_table
from storage.versions import installed_versions
from sweep.results.tally import Tally
from sweep.run.contracts import SpentAttempt
from sweep.search.strategies import SearchPlan
from sweep.spec import BACKEND_CHOICES, Spec, SpecError, name_problem
from sweep.spec.space import Space

# Errors of the run directory's filesystem, reported as one line (exit 1), not a traceback.
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG,
                  errno.EACCES, errno.EPERM}


def storage_error(e: BaseException, directory: Path) -> bool:
    """A failed write in the run directory (a full disk, say): one line and exit 1. Any
    other error is a bug and keeps its traceback."""
    if not isinstance(e, OSError) or e.errno not in STORAGE_ERRNOS or not e.filename:
        return False
    return Path(os.fsdecode(e.filename)).absolute().is_relative_to(directory)


META = "run.json"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def spec(self) -> Path:
        return self.path / "spec.yaml"

    @property
    def trials(self) -> Path:
        return self.path / "trials.parquet"

    @property
    def best(self) -> Path:
        return self.path / "best.json"

    @property
    def snapshot(self) -> Path:
        return self.path / "snapshot.json"

    @property
    def journal(self) -> Path:
        return self.path / "journal.jsonl"

    @property
    def attempts(self) -> Path:
        return self.path / "attempts.jsonl"

    @property
    def ray_log(self) -> Path:
        """Ray's own reports to the driver (its paragraph on each dead worker)."""
        return self.path / "ray.log"

    @property
    def workers_log(self) -> Path:
        """What the local runtime's worker processes print (a kernel's prints, Triton's
        warnings): never the terminal's."""
        return self.path / "workers.log"

    @property
    def meta(self) -> Path:
        return self.path / META

    def holds_run(self) -> bool:
        """Any file of a run: a directory holding one is never taken for a new run."""
        return any(p.exists() for p in (self.meta, self.journal, self.trials, self.spec))


def default_out(spec: Spec) -> Path:
    """runs/NAME-DATE-TIME, with a suffix when a run started in the same second."""
    base = Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def create(run: RunDir, spec: Spec, total: int, backend: str,
           search: SearchPlan | None = None) -> None:
    """Lay down a new run in its (locked, empty of runs) directory. run.json goes last,
    so a start cut short leaves no "run" behind. search: what a search decided at the
    start and must decide the same on resume (its batch size, its warm start)."""
    write_bytes_atomically(run.spec, spec.as_yaml().encode())
    meta = {"fingerprint": spec.fingerprint, "declared": spec.declared_fingerprint,
            "name": spec.name, "total": total, "backend": backend,
            "created_at": time.time(), "versions": versions()}
    if search is not None:
        meta["search"] = search.to_json()
    meta["sha256"] = _meta_checksum(meta)
    write_bytes_atomically(run.meta, (json.dumps(meta, indent=2) + "\n").encode())


def _meta_checksum(meta: dict[str, Any]) -> str:
    """Over everything run.json decides (the search's plan too, which the fingerprint
    does not cover): an edit would silently change what a resume runs."""
    return checksum({k: v for k, v in meta.items() if k != "sha256"})


def read_meta(run: RunDir) -> dict[str, Any]:
    try:
        meta = read_json(run.meta)
        out = {k: meta[k] for k in ("fingerprint", "declared", "name", "total", "backend")}
    except FileNotFoundError:
        raise SpecError(f"{run.path}: not a sweep run directory (no {META})") from None
    except ReadBackError as e:
        raise SpecError(str(e)) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"{run.meta}: unreadable ({type(e).__name__}: {e})") from None
    # Files written before the checksum existed are taken as they are.
    try:
        changed = "sha256" in meta and meta["sha256"] != _meta_checksum(meta)
    except ValueError:  # text no UTF-8 can hold (a lone surrogate): not ours
        changed = True
    if changed:
        raise SpecError(f"{run.meta}: changed since the run wrote it (its checksum does not "
                        "match); restore it, or start a new run with sweep run")
    if not isinstance(out["total"], int) or isinstance(out["total"], bool) or \
            out["total"] < 0 or not all(
            isinstance(out[k], str) for k in ("fingerprint", "declared", "name", "backend")) \
            or out["backend"] not in BACKEND_CHOICES:
        raise SpecError(f"{run.meta}: unreadable (a value of the wrong type)")
    if name_problem(out["name"]) is not None:
        raise SpecError(f"{run.meta}: unreadable (its name {printable(out['name'], 40)!r} "
                        "is no run's name)")
    if meta.get("search") is not None:
        try:
            out["search"] = SearchPlan.from_json(meta["search"], out["total"])
        except ValueError as e:
            raise SpecError(f"{run.meta}: unreadable ({e})") from None
    return out


def versions() -> dict[str, str]:
    return {"python": platform.python_version(),
            **installed_versions({"torch": "torch", "triton": "triton", "ray": "ray",
                                  "triton-sweep": "project"})}


@dataclass
class Finish:
    """What a run's finish decided (sweep/run/finish.py), as its files hold it: the
    finalists' re-timing, the torch baseline's timing by device type, and whether a stop
    left the best one pass's (unsettled)."""

    finalists: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, dict[str, Any]] = field(default_factory=dict)
    unsettled: bool = False
    # A sweep over problems: each problem's own finish (this one holds the first's
    # finalists and baseline, which best.json leads with).
    problems: list[Finish] = field(default_factory=list)


def problems_of(spec: Spec, tally: Tally, finish: Finish) -> list[dict[str, Any]]:
    """best.json's by_problem (nothing for a sweep of one problem)."""
    problems, finishes = spec.each_problem(), finish.problems
    return [problem_doc(dict(problems[p]), tally.starts[p], mine.total, mine.best,
                        mine.by_device,
                        *((finishes[p].finalists, finishes[p].baseline)
                          if p < len(finishes) else ([], {})))
            for p, mine in enumerate(tally.problems)]


@dataclass(frozen=True)
class Moments:
    """When this session did what (the snapshot's timeline: session_start onwards, wall
    clock), when it handed out its first trial, and the spans of the sessions before it
    (see Snapshot.sessions)."""

    timeline: dict[str, float]
    earlier: list[list[float]]
    first_dispatch_at: float | None = None


def snapshot_of(spec: Spec, tally: Tally, state: RunState, moments: Moments,
                finish: Finish | None = None) -> Snapshot:
    """In a sweep over problems, the best is the first problem's."""
    finish = finish or Finish()
    now = time.time()
    timeline = moments.timeline
    this = [[timeline["session_start"], now]] if "session_start" in timeline else []
    head = tally.headline
    return Snapshot(state=state, fingerprint=spec.fingerprint, total=tally.total,
                    done=tally.done, counts=dict(tally.counts), best=head.best,
                    first_dispatch_at=moments.first_dispatch_at,
                    finalists=list(finish.finalists), timeline=dict(timeline),
                    by_device=dict(head.by_device), baseline=dict(finish.baseline),
                    sessions=[*moments.earlier, *this], written_at=now,
                    by_problem=problems_of(spec, tally, finish))


def record_check(spec: Spec, space: Space) -> RecordCheck:
    return RecordCheck(total=len(space), run=spec.fingerprint,
                       expected_configs=space.config_json_column)


@dataclass(frozen=True)
class Loaded:
    records: pa.Table  # every durable record, one per index, sorted by index
    journal_end: int  # where the complete part of the journal ends
    recovered: pa.Table  # rows only the table held (its journal was replaced): re-journal
    table_is_current: bool = False  # trials.parquet holds exactly these records


def load_records(run: RunDir, spec: Spec, space: Space) -> Loaded:
    """Every durable record: those in trials.parquet (a checkpoint, with the journal
    length it covers), then the journal from that point on, when the journal is the one
    the table was written from. Otherwise (after a SIGKILL with no table, a damaged table,
    a run directory restored with an older or other journal) the whole journal, plus any
    valid rows only the table holds."""
    check = record_check(spec, space)
    table, start, mark = None, 0, None
    if run.trials.exists():
        try:
            table, meta = records_from_table(run.trials)
            if meta["fingerprint"] != spec.fingerprint:
                table = None
            else:
                start, mark = int(meta["journal_bytes"]), meta.get("journal_mark")
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException):
            table = None
    if table is not None and start > 0 and mark is not None and \
            line_mark(run.journal, start) == mark:
        records, end = read_journal(run.journal, check, start, table)
        current = end == start and records.num_rows == table.num_rows
        return Loaded(records, end, records.slice(0, 0), current)
    records, end = read_journal(run.journal, check)
    recovered = records.slice(0, 0)
    if table is not None and table.num_rows:
        # Checked like journal lines (read_journal checks `before` rows), nothing read.
        table, _ = read_journal(run.journal, check, end, table)
        recovered = table.filter(_newer_than(table, records))
        if recovered.num_rows:
            records = latest_per_index(pa.concat_tables([records, recovered]))
    return Loaded(records, end, recovered)


def _newer_than(table: pa.Table, records: pa.Table) -> Any:
    """Rows of `table` whose index `records` lacks, or holds at a lower attempt (a retry
    only the table saw)."""
    if records.num_rows == 0:
        return pa.array([True] * table.num_rows)
    position = pc.index_in(table.column("index"), value_set=records.column("index"))
    theirs = pc.take(records.column("attempt"), pc.fill_null(position, 0))
    return pc.or_(pc.is_null(position),
                  pc.fill_null(pc.greater(table.column("attempt"), theirs), False))


def write_trials(run: RunDir, spec: Spec, space: Space, state: RunState) -> None:
    """Rebuild trials.parquet, whole and atomically, from the durable records."""
    loaded = load_records(run, spec, space)
    records = loaded.records
    params = space.arrow_columns(records.column("index").to_numpy())
    devices = sorted(d for d in pc.unique(records.column("device")).to_pylist() if d)
    meta = json_metadata(
        fingerprint=spec.fingerprint, spec=spec_json(spec), versions=versions(),
        devices=devices, state=state, journal_bytes=str(loaded.journal_end),
        journal_mark=line_mark(run.journal, loaded.journal_end) or "")
    write_table(run.trials, build_table(records, params, meta))


def write_artefacts(run: RunDir, spec: Spec, space: Space, tally: Tally, state: RunState,
                    moments: Moments, finish: Finish) -> None:
    """The public artefacts of a stopped run: trials.parquet, best.json, snapshot.json."""
    write_trials(run, spec, space, state)
    snap = snapshot_of(spec, tally, state, moments, finish)
    write_best(run.best, snap.best, fingerprint=spec.fingerprint, partial=state != "complete",
               finalists=list(finish.finalists), by_device=snap.by_device,
               baseline=dict(finish.baseline), by_problem=snap.by_problem)
    write_snapshot(run.snapshot, snap)


class RunLog:
    """The driver's TrialLog: finished trials into the journal and spent attempts into
    the attempt log, each line marked with the run's fingerprint, fsync'd before they
    count. A failed write (a full disk) raises JournalWriteError with nothing torn."""

    def __init__(self, journal: LineLog, attempts: LineLog, fingerprint: str) -> None:
        self.journal, self.attempts, self.fingerprint = journal, attempts, fingerprint

    @classmethod
    def open(cls, run: RunDir, fingerprint: str) -> RunLog:
        """The run's own: its journal and attempt log files."""
        journal = Journal(run.journal)
        try:
            return cls(journal, Journal(run.attempts), fingerprint)
        except BaseException:
            journal.close()
            raise

    def commit(self, records: list[TrialRecord], attempts: list[SpentAttempt],
               lines: list[bytes | None]) -> None:
        if attempts:
            self.attempts.append(encode_attempt(a.index, a.attempt, a.event, self.fingerprint,
                                                a.why) for a in attempts)
        if records:
            self.journal.append(line or encode(record, self.fingerprint)
                                for record, line in zip(records, lines))

    def close(self) -> None:
        self.journal.close()
        self.attempts.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rows_as_records(rows: pa.Table) -> list[TrialRecord]:
    return [TrialRecord.from_json({**row, "config": json.loads(row["config"])})
            for row in rows.to_pylist()]


class TableCheckpoint:
    """Rewrites trials.parquet in the background now and then while a run goes on, so a
    run killed with SIGKILL resumes from the table and a short journal tail instead of
    parsing the whole journal (seconds at a million trials), and a person can read the
    table mid-run. The cost is amortised: the next write waits at least `ratio` times as
    long as the last one took. A write that fails (a full disk) is skipped: the table on
    disk stays the last complete one."""

    def __init__(self, run: RunDir, spec: Spec, space: Space, ratio: float = 20.0) -> None:
        self.run, self.spec, self.space = run, spec, space
        self.ratio = ratio
        self._thread: threading.Thread | None = None
        self._last_end = time.monotonic()
        self._last_took = 0.0

    def maybe_start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        if time.monotonic() - self._last_end < self.ratio * self._last_took:
            return
        self._thread = threading.Thread(target=self._write, name="table-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _write(self) -> None:
        t0 = time.monotonic()
        with contextlib.suppress(OSError):  # the journal is the truth; the stop writes it
            write_trials(self.run, self.spec, self.space, "running")
        self._last_end = time.monotonic()
        self._last_took = self._last_end - t0

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


def spec_json(spec: Spec) -> dict[str, Any]:
    return {"name": spec.name, **spec.identity(), "run": asdict(spec.run),
            **({"work": dict(spec.work)} if spec.work else {})}
