"""Repairs of a resumed run directory: rows only trials.parquet held go back into the
journal, the one durable truth; a complete run's missing or damaged table and best.json
are rebuilt, and nothing intact is rewritten."""

from __future__ import annotations

from storage.best_file import read_best, write_best
from storage.journal import Journal, append_records
from storage.snapshot import read_snapshot
from sweep.run import rundir
from sweep.run.rundir import Loaded, RunDir
from sweep.spec import Spec
from sweep.spec.space import Space


def rejournal(run: RunDir, spec: Spec, loaded: Loaded) -> str:
    """Rows only trials.parquet held (its journal was replaced by an older or other one)
    go back into the journal. Returns the line that says so."""
    with Journal(run.journal) as journal:
        append_records(journal, rundir.rows_as_records(loaded.recovered), spec.fingerprint)
    return (f"recovered {loaded.recovered.num_rows} trials that only trials.parquet held "
            "into the journal")


def repair_complete(run: RunDir, spec: Spec, space: Space, loaded: Loaded) -> str:
    """A complete run resumed again: nothing is run (best.json holds the finalists'
    re-timing, which the journal does not). The table is rebuilt from the journal and
    best.json from the snapshot where missing or damaged. Returns what was done."""
    snap = read_snapshot(run.snapshot)
    rebuilt = []
    if not loaded.table_is_current or loaded.recovered.num_rows:
        rundir.write_trials(run, spec, space, "complete")
        rebuilt.append("trials.parquet")
    if read_best(run.best, spec.fingerprint) is None:
        write_best(run.best, snap.best, fingerprint=spec.fingerprint, partial=False,
                   finalists=snap.finalists, by_device=snap.by_device,
                   baseline=snap.baseline, by_problem=snap.by_problem)
        rebuilt.append("best.json")
    return "rebuilt " + " and ".join(rebuilt) if rebuilt else "nothing to do"
