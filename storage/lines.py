"""The journal's line format, for writing: apart from the reader (storage/journal.py, which
needs pyarrow) so that workers, which encode their own lines, import nothing heavier than json.

One JSON object a line, each carrying the run's fingerprint.
"""

from __future__ import annotations

import json
import re
from typing import Literal, get_args

from storage.records import TrialRecord, canonical_json, valid_text

RUN_FIELD = "run"  # the journal-only field: the fingerprint of the run that wrote the line
_RUN = re.compile(r"[0-9a-f]{16}")

AttemptEvent = Literal["died", "interrupted"]
ATTEMPT_EVENTS: tuple[str, ...] = get_args(AttemptEvent)
WHY_FIELD = "why"  # an attempt line's optional reason (lines before it have none)

_LINE = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # built once, as it is costly


def check_run(run: str) -> None:
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise ValueError(f"a run's fingerprint is 16 lowercase hex digits, not {run!r}")


def encode(record: TrialRecord, run: str) -> bytes:
    """One journal line: the record, its config as canonical JSON, and the run's fingerprint."""
    check_run(run)
    data = record.to_json()
    data["config"] = canonical_json(data["config"])
    data[RUN_FIELD] = run
    return (_LINE.encode(data) + "\n").encode()


def encode_attempt(index: int, attempt: int, event: AttemptEvent, run: str,
                   why: str | None = None) -> bytes:
    """An attempt spent without a record: its worker "died" (why: how, in one line), or the
    run was "interrupted"."""
    check_run(run)
    if event not in ATTEMPT_EVENTS:
        raise ValueError(f"unknown attempt event {event!r}")
    line: dict[str, object] = {"index": index, "attempt": attempt, "event": event,
                               RUN_FIELD: run}
    if why is not None:
        line[WHY_FIELD] = valid_text(why)
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()
