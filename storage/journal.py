"""What the journal, a run's durable truth, means: the records its lines and the attempt log's
hold, the rules each keeps and the state replayed from them (the bytes: journal_file.py).

Every line carries the run's fingerprint, and reading checks every record against the run
(RecordCheck): a line that is not a well-formed record of this run, anywhere but in the torn
tail, is reported with its line number, never skipped and never believed.

Reading goes through pyarrow's JSON reader (C++, multithreaded) and checks the records with
vectorised compute, which keeps a resume of a million-trial run within seconds; Python's
json only serves a damaged or oddly formatted file, and names its first bad line.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as paj

from storage.journal_file import (
    Journal,
    JournalError,
    complete_blocks,
    complete_lines,
    lines_before,
)
from storage.lines import (
    ATTEMPT_EVENTS,
    RUN_FIELD,
    WHY_FIELD,
    check_run,
    encode,
)
from storage.records import (
    MAX_ERROR_CHARS,
    STATUSES,
    VALIDATIONS,
    TrialRecord,
)
from storage.schema import RECORD_COLUMNS, RECORD_SCHEMA, TABLE_RANGES

JOURNAL_SCHEMA = RECORD_SCHEMA.append(pa.field(RUN_FIELD, pa.string()))

PARSE_BLOCK = 32 << 20  # how much of the journal is parsed at a time


@dataclass(frozen=True)
class RecordCheck:
    """What every record of a run must agree with."""

    total: int  # valid indices are 0..total-1
    run: str  # the run's fingerprint, which every line must carry
    # For an int64 array of valid indices, the canonical config JSON each must carry.
    expected_configs: Callable[[np.ndarray], pa.Array]

    def __post_init__(self) -> None:
        check_run(self.run)
        if self.total < 0:
            raise ValueError(f"total {self.total} is negative")


def append_records(journal: Journal, records: Iterable[TrialRecord], run: str) -> int:
    """records as this run's lines, appended as one group (see Journal.append)."""
    return journal.append(encode(r, run) for r in records)


# -- reading: lines --------------------------------------------------------------------

class _Bad(Exception):
    """What is wrong with one line or row, in words."""


_JSON_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "an array", dict: "an object", type(None): "null"}


def _kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Bad(f"key {key!r} appears twice")
        seen[key] = value
    return seen


def _no_constant(name: str) -> None:
    raise _Bad(f"{name} is not a JSON number")


def _json_object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line, object_pairs_hook=_no_repeats, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise _Bad("not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise _Bad(f"not JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # an integer of thousands of digits
        raise _Bad(f"not a JSON value this file holds ({e})") from None
    except RecursionError:
        raise _Bad("nested too deeply to be a record") from None
    if not isinstance(value, dict):
        raise _Bad(f"not a JSON object but {_kind(value)}")
    # json reads a lone surrogate (escaped, or its bytes) into a str that no file or
    # table can hold again: refused here, not where the run is next written.
    if not line.isascii() or b"\\u" in line:
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise _Bad("holds a lone surrogate, which is not text") from None
    return value


def _check_keys(row: dict[str, Any], keys: Iterable[str], optional: Iterable[str] = ()) -> None:
    expected = list(keys)
    missing = [k for k in expected if k not in row]
    unknown = [k for k in row if k not in expected and k not in optional]
    if missing:
        raise _Bad(f"lacks {', '.join(missing)}")
    if unknown:
        raise _Bad(f"has unknown keys {', '.join(unknown)}")


def _expected_kind(value: object, type_: pa.DataType) -> str | None:
    """What a JSON value for a column of type_ should be, if it is not that; else None."""
    if pa.types.is_int64(type_):
        if type(value) is int and -(2**63) <= value < 2**63:
            return None
        return "a 64-bit integer"
    if pa.types.is_float64(type_):
        if type(value) in (int, float) and math.isfinite(value):  # type: ignore[arg-type]
            return None
        return "a finite number"
    return None if type(value) is str else "a string"


_NULLABLE = {c.name: c.nullable for c in RECORD_COLUMNS} | {RUN_FIELD: False}


def _parse_record(line: bytes) -> dict[str, Any]:
    """One journal line as a row of JOURNAL_SCHEMA, its JSON shape checked; _Bad if not."""
    row = _json_object(line)
    _check_keys(row, JOURNAL_SCHEMA.names)
    for field in JOURNAL_SCHEMA:
        value = row[field.name]
        if value is None:
            if not _NULLABLE[field.name]:
                raise _Bad(f"{field.name} is null")
            continue
        expected = _expected_kind(value, field.type)
        if expected is not None:
            raise _Bad(f"{field.name}: expected {expected}, got {_kind(value)} "
                       f"{json.dumps(value)[:40]}")
    return row


def _key_patterns() -> tuple[tuple[bytes, int], ...]:
    """(pattern, keys it matches) for finding lines that lack a nullable key, which pyarrow
    reads as null. A key's end, `_ms":`, occurs only where a key ends (inside a string the
    quote would be escaped), and the fast path has refused unknown and repeated keys; so if
    a pattern occurs `keys` times per line on average, every line has every key it matches.
    Grouping keys by their last word keeps the passes over the data few."""
    names = JOURNAL_SCHEMA.names
    ends = {f"_{c.name.rsplit('_', 1)[1]}" if "_" in c.name else f'"{c.name}'
            for c in RECORD_COLUMNS if c.nullable}
    return tuple((f'{end}":'.encode(), sum(f'"{n}'.endswith(end) for n in names))
                 for end in sorted(ends))


_KEY_PATTERNS = _key_patterns()


# How encode() begins and ends a line: with the first field, and with the run's fingerprint
# (a string) as the last value. A long needle makes counting line joints fast.
_LINE_START = f'{{"{JOURNAL_SCHEMA.names[0]}":'.encode()
_LINE_END = b'"}\n'
_JOINT = _LINE_END + _LINE_START


def _parse_fast(data: bytes, n: int) -> pa.Table | None:
    """data[:n] (whole lines) through pyarrow's JSON reader, or None when its shape needs
    the line-by-line path: pyarrow (26) crashes on a line holding just `null`, and reads
    blank lines, an object spread over lines, two objects on a line and missing keys
    without complaint, and does not check that strings are UTF-8. So it only gets lines
    that begin and end as encode() writes them (others take the slow path), and its result
    stands only with one row a line, valid text and no nullable key missing."""
    lines = data.count(b"\n", 0, n)
    if not (data.startswith(_LINE_START) and data.startswith(_LINE_END, n - len(_LINE_END), n)
            and data.count(_JOINT, 0, n) == lines - 1):
        return None
    # Counting keys is a pass over the data per pattern: it runs while pyarrow parses,
    # which releases the GIL.
    with ThreadPoolExecutor(1) as pool:
        keys_present = pool.submit(_every_line_has_the_nullable_keys, data, n, lines)
        try:
            table = paj.read_json(
                pa.BufferReader(pa.py_buffer(data).slice(0, n)),
                parse_options=paj.ParseOptions(explicit_schema=JOURNAL_SCHEMA,
                                               unexpected_field_behavior="error"))
            table.validate(full=True)  # pyarrow's parser leaves text that is not UTF-8 be
        except (pa.ArrowException, ValueError):
            return None
        if table.num_rows != lines or not keys_present.result():
            return None
    return table


def _every_line_has_the_nullable_keys(data: bytes, n: int, lines: int) -> bool:
    return all(data.count(pattern, 0, n) == keys * lines for pattern, keys in _KEY_PATTERNS)


# -- reading: what every record must be ------------------------------------------------

Row = dict[str, Any]
Rule = tuple[Any, Callable[[Row], str]]  # per-row booleans (null fails; None: all hold)


def _rules(table: pa.Table, check: RecordCheck) -> Iterator[Rule]:
    """Each rule a record must keep, in the order their failures are reported."""
    with_run = RUN_FIELD in table.column_names
    required = [c.name for c in RECORD_COLUMNS if not c.nullable]
    if with_run:
        required.append(RUN_FIELD)
    for name in required:
        column = table[name]
        yield pc.is_valid(column) if column.null_count else None, _says_missing(name)
    index = table["index"]
    in_range = pc.and_(pc.greater_equal(index, 0), pc.less(index, check.total))
    yield in_range, lambda row: f"index {row['index']} is outside 0..{check.total - 1}"
    if with_run:
        yield (pc.equal(table[RUN_FIELD], check.run),
               lambda row: f"written by another run ({row[RUN_FIELD]}, this run is {check.run})")
    yield _configs_match(table, check, in_range), lambda row: (
        f"config {row['config']} is not config {row['index']}, "
        f"{_expected_config(check, row['index'])}")
    yield (pc.is_in(table["status"], value_set=pa.array(STATUSES)),
           lambda row: f"unknown status {row['status']!r}")
    yield (pc.is_in(table["validation"], value_set=pa.array(VALIDATIONS)),
           lambda row: f"unknown validation {row['validation']!r}")
    yield (pc.equal(pc.is_valid(table["latency_ms"]), pc.equal(table["status"], "ok")),
           lambda row: "status ok without latency_ms" if row["status"] == "ok"
           else f"latency_ms given for status {row['status']!r}")
    yield pc.greater_equal(table["attempt"], 1), lambda row: f"attempt {row['attempt']} is below 1"
    yield (pc.fill_null(pc.less_equal(pc.utf8_length(table["error"]), MAX_ERROR_CHARS), True),
           lambda row: f"error is longer than {MAX_ERROR_CHARS} characters")
    for c in RECORD_COLUMNS:
        if pa.types.is_floating(c.type):
            yield pc.fill_null(pc.is_finite(table[c.name]), True), _says_not_finite(c.name)
    for c in RECORD_COLUMNS:  # a duration below zero would rank first
        if c.name.endswith("_ms"):
            yield (pc.fill_null(pc.greater_equal(table[c.name], 0), True),
                   _says_negative(c.name))
    for name, (lo, hi) in TABLE_RANGES.items():
        column = table[name]
        fits = pc.and_(pc.greater_equal(column, lo), pc.less_equal(column, hi))
        yield pc.fill_null(fits, True), _says_out_of_range(name, lo, hi)


def _says_missing(name: str) -> Callable[[Row], str]:
    return lambda row: f"{name} is missing or null"


def _says_not_finite(name: str) -> Callable[[Row], str]:
    return lambda row: f"{name} {row[name]} is not finite"


def _says_negative(name: str) -> Callable[[Row], str]:
    return lambda row: f"{name} {row[name]} is negative"


def _says_out_of_range(name: str, lo: float, hi: float) -> Callable[[Row], str]:
    return lambda row: f"{name} {row[name]} is outside the table's range {lo:.15g}..{hi:.15g}"


def _configs_match(table: pa.Table, check: RecordCheck, in_range: Any) -> Any:
    """Per row: its config is the one its index names (rows with a bad index fail)."""
    valid = np.asarray(pc.fill_null(in_range, False))
    if not valid.any():
        return pa.array(valid)
    index = np.asarray(pc.fill_null(table["index"], -1))
    config = table["config"]
    if valid.all():
        return pc.equal(config, check.expected_configs(index))
    same = np.zeros(len(valid), dtype=bool)
    expected = check.expected_configs(index[valid])
    same[valid] = np.asarray(pc.fill_null(pc.equal(config.filter(pa.array(valid)), expected),
                                          False))
    return pa.array(same)


def _expected_config(check: RecordCheck, index: int) -> str:
    return str(check.expected_configs(np.array([index], dtype=np.int64))[0].as_py())


def _first_failure(mask: Any) -> int | None:
    if mask is None:
        return None
    if mask.null_count:
        mask = pc.fill_null(mask, False)
    if pc.all(mask).as_py():
        return None
    return int(np.argmin(np.asarray(mask)))


def _first_problem(table: pa.Table, check: RecordCheck) -> tuple[int, str] | None:
    """The first row that breaks a rule, and what is wrong with it (the first rule it breaks);
    None when every row keeps every rule."""
    if table.num_rows == 0:
        return None
    first: tuple[int, Callable[[Row], str]] | None = None
    for mask, problem in _rules(table, check):
        row = _first_failure(mask)
        if row is not None and (first is None or row < first[0]):
            first = (row, problem)
    if first is None:
        return None
    row, problem = first
    return row, problem(table.slice(row, 1).to_pylist()[0])


# -- reading: the journal --------------------------------------------------------------

def read_journal(path: Path, check: RecordCheck, start: int = 0,
                 before: pa.Table | None = None) -> tuple[pa.Table, int]:
    """Every durable record from byte `start` on, after the records `before` (read earlier,
    e.g. from the table, in the record columns), once per index (see latest_per_index), sorted by
    index, in the record columns; and the byte offset where the complete part of the
    journal ends. Every record must pass `check`, else JournalError names the first that
    does not ("<path>: line N: ..."); only the torn, newline-less tail is ignored."""
    parts: list[pa.Table] = []
    if before is not None and before.num_rows:
        parts.append(_checked_before(path, before, check, start))
    end = start  # where the complete lines read so far end
    with contextlib.closing(complete_blocks(path, start, PARSE_BLOCK)) as blocks:
        for data, n in blocks:
            parts.append(_checked_lines(path, data, n, check, end))
            end += n
    table = pa.concat_tables(parts) if parts else RECORD_SCHEMA.empty_table()
    del parts
    return latest_per_index(table), end


def _checked_before(path: Path, before: pa.Table, check: RecordCheck, start: int) -> pa.Table:
    where = f"{path}: the table read before byte {start}"
    try:
        table = before.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)
        table.validate(full=True)
    except (KeyError, pa.ArrowException) as e:
        raise JournalError(f"{where}: does not hold the record columns ({e})") from None
    problem = _first_problem(table, check)
    if problem is not None:
        raise JournalError(f"{where}, row {problem[0] + 1}: {problem[1]}")
    return table


def _checked_lines(path: Path, data: bytes, n: int, check: RecordCheck,
                   start: int) -> pa.Table:
    def fail(row: int, problem: str) -> JournalError:
        # Counting the lines before `start` costs a pass over them: only on the way out.
        return JournalError(f"{path}: line {lines_before(path, start) + row + 1}: {problem}")

    table = _parse_fast(data, n)
    if table is None:
        rows: list[Row] = []
        bad: tuple[int, str] | None = None
        for number, line in enumerate(data[:n].split(b"\n")[:-1]):
            try:
                rows.append(_parse_record(line))
            except _Bad as e:
                bad = (number, str(e))
                break
        table = pa.Table.from_pylist(rows, schema=JOURNAL_SCHEMA)
        problem = _first_problem(table, check)  # a line before the shapeless one may lie
        if problem is None and bad is not None:
            problem = bad
    else:
        problem = _first_problem(table, check)
    if problem is not None:
        raise fail(*problem)
    return table.select(RECORD_SCHEMA.names)


def latest_per_index(table: pa.Table) -> pa.Table:
    """One record per index: the highest attempt, which only a retry (`sweep resume
    --retry`) makes a second record of; among equal attempts the first arrival."""
    if table.num_rows == 0:
        return table
    # Stable sort keeps journal order among equal (index, attempt) pairs.
    order = pc.sort_indices(table, sort_keys=[("index", "ascending"), ("attempt", "descending")])
    table = table.take(order)
    index = table.column("index").to_numpy()
    if len(index) > 1 and (index[1:] == index[:-1]).any():
        keep = np.ones(len(index), dtype=bool)
        keep[1:] = index[1:] != index[:-1]
        table = table.filter(pa.array(keep))
    return table


# -- reading: the attempt log ----------------------------------------------------------

def read_attempts(path: Path, check: RecordCheck) -> tuple[dict[int, int], dict[int, int]]:
    """(highest attempt spent, worker deaths) per index, from the attempt log. A complete
    line that is not an attempt event of this run is a JournalError naming it."""
    spent: dict[int, int] = {}
    deaths: dict[int, int] = {}
    for number, line in enumerate(complete_lines(path), start=1):
        try:
            index, attempt, event = _parse_attempt(line, check)
        except _Bad as e:
            raise JournalError(f"{path}: line {number}: {e}") from None
        spent[index] = max(spent.get(index, 0), attempt)
        if event == "died":
            deaths[index] = deaths.get(index, 0) + 1
    return spent, deaths


def _parse_attempt(line: bytes, check: RecordCheck) -> tuple[int, int, str]:
    event = _json_object(line)
    _check_keys(event, ("index", "attempt", "event", RUN_FIELD), optional=(WHY_FIELD,))
    index, attempt, kind, run = (event[k] for k in ("index", "attempt", "event", RUN_FIELD))
    if not isinstance(event.get(WHY_FIELD, ""), str):
        raise _Bad(f"why {json.dumps(event[WHY_FIELD])} is not a string")
    if type(index) is not int or not 0 <= index < check.total:
        raise _Bad(f"index {json.dumps(index)} is not an integer in 0..{check.total - 1}")
    if type(attempt) is not int or attempt < 1:
        raise _Bad(f"attempt {json.dumps(attempt)} is not an integer from 1")
    if kind not in ATTEMPT_EVENTS:
        raise _Bad(f"unknown event {json.dumps(kind)}")
    if run != check.run:
        raise _Bad(f"written by another run ({json.dumps(run)}, this run is {check.run})")
    return index, attempt, kind
