"""Loading and validating a sweep spec (YAML) into a typed, immutable Spec.

Every mistake is one SpecError line naming the file, the key (or the YAML line) and what
was expected; it is raised before any Ray or GPU work starts. Unknown keys are errors: a
typo must never fall back to a default silently. Values shown in a message are clipped, and
the file's size, nesting and aliases are bounded, so no input can make an error line, or
loading itself, huge.

This package's public names, gathered from the modules of one concern each: model (the
dataclasses, names and limits), yaml_loader, rules, sections, replay_table, kernels and
loader (load_spec's steps).
"""

from sweep.spec.kernels import check_dtype_for_backend
from sweep.spec.loader import load_spec
from sweep.spec.model import (
    BACKEND_CHOICES,
    INT64_MAX,
    INT64_MIN,
    KERNEL_FREE,
    LAUNCH_OPTIONS,
    MAX_CONFIGS,
    MAX_NAME_CHARS,
    MAX_NESTING,
    MAX_POINTS,
    MAX_SPEC_BYTES,
    REPLAY_TABLE_LIMIT,
    RUNTIMES,
    ReplayOptions,
    RunOptions,
    Screen,
    SimulateOptions,
    Spec,
    SpecError,
    Timing,
    Tolerance,
)
from sweep.spec.rules import (
    AT_LEAST_ONE,
    COUNT,
    FRACTION,
    INTEGER,
    NON_NEGATIVE,
    POSITIVE,
    TOP_KEYS,
    Check,
)
from sweep.spec.sections import name_problem
from sweep.spec.yaml_loader import read_spec_text

__all__ = [
    "AT_LEAST_ONE",
    "BACKEND_CHOICES",
    "COUNT",
    "FRACTION",
    "INT64_MAX",
    "INT64_MIN",
    "INTEGER",
    "KERNEL_FREE",
    "LAUNCH_OPTIONS",
    "MAX_CONFIGS",
    "MAX_NAME_CHARS",
    "MAX_NESTING",
    "MAX_POINTS",
    "MAX_SPEC_BYTES",
    "NON_NEGATIVE",
    "POSITIVE",
    "REPLAY_TABLE_LIMIT",
    "RUNTIMES",
    "TOP_KEYS",
    "Check",
    "ReplayOptions",
    "RunOptions",
    "Screen",
    "SimulateOptions",
    "Spec",
    "SpecError",
    "Timing",
    "Tolerance",
    "check_dtype_for_backend",
    "load_spec",
    "name_problem",
    "read_spec_text",
]
