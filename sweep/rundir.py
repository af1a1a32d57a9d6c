"""The run directory: what `sweep run` lays down, what `sweep resume` reads back, and how
the public artefacts (trials.parquet, best.json, snapshot.json) are produced from the
journal."""

from __future__ import annotations

import json
import platform
import threading
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storage.atomic import write_bytes_atomically
from storage.journal import read_journal
from storage.snapshot import RunState, Snapshot, write_best, write_snapshot
from storage.table import build_table, json_metadata, records_from_table, write_table
from sweep.space import Space
from sweep.spec import Spec, SpecError
from sweep.tally import Tally

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
    def meta(self) -> Path:
        return self.path / META

    def holds_run(self) -> bool:
        # run.json is written last by create(), so a start cut short leaves no "run" behind.
        return any(p.exists() for p in (self.meta, self.journal, self.trials))


def default_out(spec: Spec) -> Path:
    return Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def create(path: Path, spec: Spec, total: int, backend: str) -> RunDir:
    run = RunDir(path)
    if run.holds_run():
        raise SpecError(f"{path}: already holds a run; continue it with: sweep resume {path}")
    if path.exists() and not path.is_dir():
        raise SpecError(f"--out: {path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(run.spec, spec.as_yaml().encode())
    meta = {"fingerprint": spec.fingerprint, "total": total, "backend": backend,
            "created_at": time.time(), "versions": versions()}
    write_bytes_atomically(run.meta, (json.dumps(meta, indent=2) + "\n").encode())
    return run


def read_meta(run: RunDir) -> dict[str, Any]:
    if not run.path.is_dir():
        raise SpecError(f"{run.path}: no such run directory")
    try:
        meta = json.loads(run.meta.read_text())
        return {k: meta[k] for k in ("fingerprint", "total", "backend")}
    except FileNotFoundError:
        raise SpecError(f"{run.path}: not a sweep run directory (no {META})") from None
    except (ValueError, KeyError, TypeError) as e:
        raise SpecError(f"{run.meta}: unreadable ({e})") from None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist, key in (("torch", "torch"), ("triton", "triton"), ("ray", "ray"),
                      ("triton-sweep", "project")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "absent"
    return out


def snapshot_of(spec: Spec, tally: Tally, state: RunState,
                first_dispatch_at: float | None = None) -> Snapshot:
    return Snapshot(state=state, fingerprint=spec.fingerprint, total=tally.total,
                    done=tally.done, counts=dict(tally.counts), best=tally.best,
                    first_dispatch_at=first_dispatch_at)


def load_records(run: RunDir, spec: Spec) -> tuple[pa.Table, int]:
    """Every durable record: those already in trials.parquet (written at the last clean
    stop, with the journal length it covers), then the journal from that point on. After
    a SIGKILL, or if the table is stale or damaged, the whole journal is read."""
    before, start = None, 0
    if run.trials.exists():
        try:
            before, meta = records_from_table(run.trials)
            start = int(meta["journal_bytes"])
            if meta["fingerprint"] != spec.fingerprint or \
                    start > run.journal.stat().st_size:
                before, start = None, 0
        except (OSError, KeyError, ValueError, pa.ArrowException):
            before, start = None, 0
    return read_journal(run.journal, start, before)


def write_trials(run: RunDir, spec: Spec, space: Space, state: RunState) -> None:
    """Rebuild trials.parquet, whole and atomically, from the durable records."""
    records, journal_bytes = load_records(run, spec)
    params = space.arrow_columns(records.column("index").to_numpy())
    devices = sorted(d for d in pc.unique(records.column("device")).to_pylist() if d)
    meta = json_metadata(
        fingerprint=spec.fingerprint, spec=spec_json(spec), versions=versions(),
        devices=devices, state=state, journal_bytes=str(journal_bytes))
    write_table(run.trials, build_table(records, params, meta))


def finalize(run: RunDir, spec: Spec, space: Space, tally: Tally, state: RunState,
             finalists: list[dict[str, Any]] | None = None,
             first_dispatch_at: float | None = None) -> None:
    """The public artefacts of a stopped run: trials.parquet, best.json, snapshot.json."""
    write_trials(run, spec, space, state)
    write_best(run.best, tally.best, fingerprint=spec.fingerprint, partial=state != "complete",
               finalists=finalists or [])
    write_snapshot(run.snapshot, snapshot_of(spec, tally, state, first_dispatch_at))


class TableCheckpoint:
    """Rewrites trials.parquet in the background now and then while a run goes on, so a
    run killed with SIGKILL resumes from the table and a short journal tail instead of
    parsing the whole journal (seconds at a million trials), and a person can read the
    table mid-run. The cost is amortised: the next write waits at least `ratio` times as
    long as the last one took."""

    def __init__(self, run: RunDir, spec: Spec, space: Space, ratio: float = 20.0) -> None:
        self.args = (run, spec, space, "running")
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
        write_trials(*self.args)  # type: ignore[arg-type]
        self._last_end = time.monotonic()
        self._last_took = self._last_end - t0

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


def spec_json(spec: Spec) -> dict[str, Any]:
    return {"name": spec.name, **spec.identity(), "run": asdict(spec.run)}
