"""What each key of a spec may hold, as one table, and the reader that applies it: a new
option is one line here, and its error message follows from it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sweep.spec.constraints import clip_repr, clip_text
from sweep.spec.model import (
    BACKEND_CHOICES,
    RUNTIMES,
    ReplayOptions,
    RunOptions,
    Screen,
    SimulateOptions,
    SpecError,
    Timing,
    Tolerance,
)
from sweep.spec.search_options import STRATEGIES, SearchOptions

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # section() reads the fields of a dataclass


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_label(v: Any) -> bool:
    """A device type or resource name: short, printable, no separators of Ray's."""
    return isinstance(v, str) and 0 < len(v) <= 64 and v.isprintable() and \
        not any(c in v for c in ":,{}[] ")


def is_off(v: Any) -> bool:
    return v is False or v == "off"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_json_scalar(v: Any) -> bool:
    return isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))


Check = tuple[Callable[[Any], bool], str]
POSITIVE: Check = (lambda v: is_number(v) and v > 0, "a number > 0")
NON_NEGATIVE: Check = (lambda v: is_number(v) and v >= 0, "a number >= 0")
FRACTION: Check = (lambda v: is_number(v) and 0 <= v <= 1, "a number from 0 to 1")
COUNT: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
AT_LEAST_ONE: Check = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
INTEGER: Check = (_is_int, "an integer")

_CHECKS: dict[type, dict[str, Check]] = {
    Timing: {"warmup_ms": NON_NEGATIVE, "rep_ms": POSITIVE},
    Screen: {"warmup_ms": NON_NEGATIVE, "rep_ms": POSITIVE},
    Tolerance: {"rtol": NON_NEGATIVE, "atol": NON_NEGATIVE},
    RunOptions: {
        "backend": (lambda v: v in BACKEND_CHOICES, "one of " + ", ".join(BACKEND_CHOICES)),
        "runtime": (lambda v: v in RUNTIMES, "one of " + ", ".join(RUNTIMES)),
        "trial_timeout_s": POSITIVE, "max_retries": COUNT, "snapshot_every_s": POSITIVE,
        "drain_s": NON_NEGATIVE, "workers": (lambda v: v is None or AT_LEAST_ONE[0](v),
                                             "an integer >= 1 or null"),
        "seed": INTEGER, "finalist_rounds": AT_LEAST_ONE, "start_timeout_s": POSITIVE,
        "finalists": (lambda v: _is_int(v) and 0 <= v <= 16, "an integer from 0 to 16"),
        "compile_timeout_s": (lambda v: v in ("auto", "off") or POSITIVE[0](v),
                              "auto, off or a number of seconds > 0"),
        "accelerator_types": (lambda v: v is None or (
            isinstance(v, list) and bool(v) and all(_is_label(t) for t in v)),
            "null or a list of accelerator type names (e.g. [H100, A100])"),
    },
    SearchOptions: {"strategy": (lambda v: v in STRATEGIES, "one of " + ", ".join(STRATEGIES)),
                    # numpy's generators take no negative seed
                    "seed": COUNT, "budget": (lambda v: is_number(v) and 0 < v <= 1,
                                                "a fraction > 0 and at most 1"),
                    "patience": FRACTION, "improvement": FRACTION,
                    "batch": (lambda v: v is None or AT_LEAST_ONE[0](v),
                              "an integer >= 1 or null (sized to the cluster)"),
                    "sample": (lambda v: is_number(v) and 0 < v <= 1,
                               "a fraction > 0 and at most 1"),
                    "eta": (lambda v: _is_int(v) and v >= 2, "an integer >= 2"),
                    "warm_start": COUNT},
    ReplayOptions: {"table": (lambda v: isinstance(v, str), "a path"),
                    "workers": AT_LEAST_ONE, "compile_slots": AT_LEAST_ONE,
                    "time_scale": POSITIVE},
    SimulateOptions: {"workers": AT_LEAST_ONE, "trial_ms": NON_NEGATIVE, "fail_rate": FRACTION,
                      "crash_rate": FRACTION, "hang_rate": FRACTION, "seed": INTEGER,
                      "devices": (lambda v: isinstance(v, dict) and all(
                          _is_label(k) and AT_LEAST_ONE[0](n) for k, n in v.items()),
                                  "a mapping of device type names to worker counts >= 1"),
                      "resources": (lambda v: isinstance(v, dict) and all(
                          _is_label(k) and POSITIVE[0](n) for k, n in v.items()),
                                    "a mapping of Ray resource names to amounts > 0")},
}
TOP_KEYS = ("name", "kernel", "problem", "problems", "fixed", "space", "configs", "constraints",
            "timing", "validation", "run", "simulate", "replay", "search")


class Reader:
    """Applies the rules to one spec file, failing with a line that names the file and key."""

    def __init__(self, path: Path, source: Path) -> None:
        self.path = path  # as given, for messages
        self.source = source  # where it is read from

    def fail(self, key: str, message: str) -> SpecError:
        return SpecError(f"{self.path}: {clip_text(key, 100)}: {message}")

    def mapping(self, value: Any, key: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {clip_repr(value)}")
        return value

    def document(self, doc: Any) -> dict[str, Any]:
        """The top-level mapping, once its keys are known ones and the required are there."""
        if not isinstance(doc, dict):
            raise SpecError(f"{self.path}: expected a mapping of spec keys at the top level")
        for key in doc:
            if key not in TOP_KEYS:
                raise self.fail(key, f"unknown key (expected one of {', '.join(TOP_KEYS)})")
        if "kernel" not in doc:
            raise self.fail("kernel", "required key is missing")
        if "space" in doc and "configs" in doc:
            raise self.fail("configs", "give space: (value lists, tuned as their product) or "
                                       "configs: (an explicit list of configs), not both")
        return doc

    def section(self, cls: type[T], value: Any, key: str) -> T:
        """A mapping of one of the option dataclasses, each key checked by _CHECKS."""
        data = self.mapping(value, key)
        checks = _CHECKS[cls]
        names = [f.name for f in fields(cls)]
        for name, v in data.items():
            if name not in names:
                raise self.fail(f"{key}.{name}",
                                f"unknown key (expected one of {', '.join(names)})")
            ok, what = checks[name]
            if not ok(v):
                raise self.fail(f"{key}.{name}", f"expected {what}, got {clip_repr(v)}")
        return cls(**data)

