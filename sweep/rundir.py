"""The run directory: what `sweep run` lays down, what `sweep resume` reads back, and how
the public artefacts (trials.parquet, best.json, snapshot.json) are produced from the
journal."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from storage.atomic import write_bytes_atomically
from storage.journal import read_journal
from storage.snapshot import RunState, Snapshot, write_best, write_snapshot
from storage.table import build_table, json_metadata, write_table
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


def snapshot_of(spec: Spec, tally: Tally, state: RunState) -> Snapshot:
    return Snapshot(state=state, fingerprint=spec.fingerprint, total=tally.total,
                    done=tally.done, counts=dict(tally.counts), best=tally.best)


def finalize(run: RunDir, spec: Spec, space: Space, tally: Tally, state: RunState) -> None:
    """Rebuild trials.parquet from the journal, then best.json and snapshot.json."""
    records = read_journal(run.journal)
    params = space.arrow_columns(records.column("index").to_numpy())
    devices = sorted(d for d in pc.unique(records.column("device")).to_pylist() if d)
    meta = json_metadata(
        fingerprint=spec.fingerprint, spec=spec_json(spec), versions=versions(),
        devices=devices, state=state)
    write_table(run.trials, build_table(records, params, meta))
    write_best(run.best, tally.best, fingerprint=spec.fingerprint, partial=state != "complete")
    write_snapshot(run.snapshot, snapshot_of(spec, tally, state))


def spec_json(spec: Spec) -> dict[str, Any]:
    return {"name": spec.name, **spec.identity(), "run": asdict(spec.run)}
