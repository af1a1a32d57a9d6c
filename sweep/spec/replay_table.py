"""Reading the recorded trial table a replayed run plays back: bounded, and checked to be a
trial table, before any worker starts."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from storage.readback import ReadBackError, read_small
from storage.schema import REPLAY_COLUMNS
from sweep.spec.model import REPLAY_TABLE_LIMIT, ReplayOptions
from sweep.spec.rules import Reader


def read_replay_table(r: Reader, options: ReplayOptions) -> tuple[ReplayOptions, str]:
    """The options with the table's absolute path (it must survive the copy into the run
    directory), and the SHA-256 of its bytes (what a replayed run's fingerprint holds)."""
    if not options.table:
        raise r.fail("replay.table", "required for run.backend: replay (a trials.parquet)")
    table = (r.source.parent / options.table).absolute()
    try:
        data = read_small(table, REPLAY_TABLE_LIMIT)
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = pq.read_schema(pa.BufferReader(data)).names
    except (OSError, ValueError) as e:
        why = e.why if isinstance(e, ReadBackError) else getattr(e, "strerror", None) or e
        raise r.fail("replay.table", f"cannot read {table} as Parquet ({why})") from None
    missing = [c for c in REPLAY_COLUMNS if c not in names]
    if missing:
        raise r.fail("replay.table", f"{table} lacks the column(s) {', '.join(missing)} of a "
                                     "trial table")
    return replace(options, table=str(table)), hashlib.sha256(data).hexdigest()

