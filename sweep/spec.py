"""Loading and validating a sweep spec (YAML) into a typed, immutable Spec.

Every mistake is one SpecError line naming the file, the key and what was expected; it is
raised before any Ray or GPU work starts. Unknown keys are errors: a typo must never fall
back to a default silently.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from sweep_kernels import DTYPES, Kernel, KernelError, load_kernel, reference_of, source_digest
from storage.records import TABLE_COLUMNS, canonical_json
from sweep.constraints import Constraint, ConstraintError, parse_constraint
from sweep.space import Space, expand, value_kind

BACKENDS = ("auto", "cuda", "interpret", "simulate")
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
MAX_POINTS = 50_000_000


class SpecError(ValueError):
    """A bad spec: the message is the one line the user sees."""


@dataclass(frozen=True)
class Screen:
    """The quick first timing every config gets when finalists are re-timed carefully."""

    warmup_ms: float = 5.0
    rep_ms: float = 20.0


@dataclass(frozen=True)
class Timing:
    warmup_ms: float = 25.0  # the careful timing: finalists, or every config without screen
    rep_ms: float = 100.0
    screen: Screen | None = Screen()

    def per_config(self, finalists: int) -> tuple[float, float]:
        """(warmup_ms, rep_ms) of each config's timing: the screen's when finalists are
        re-timed afterwards, else the careful one."""
        if self.screen is not None and finalists > 0:
            return self.screen.warmup_ms, self.screen.rep_ms
        return self.warmup_ms, self.rep_ms


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 0.01
    atol: float = 0.01


@dataclass(frozen=True)
class RunOptions:
    backend: str = "auto"
    trial_timeout_s: float = 60.0
    max_retries: int = 1
    snapshot_every_s: float = 30.0
    drain_s: float = 3.0  # how long a stopped run waits for in-flight trials
    workers: int | None = None  # cap on actors; default: every GPU (or CPU) the cluster has
    seed: int = 0  # seed of the kernel's random inputs
    finalists: int = 5  # the fastest few, re-timed side by side at the end (0: off)
    finalist_rounds: int = 3
    start_timeout_s: float = 60.0  # a worker not up by then is given up (see driver.py)


@dataclass(frozen=True)
class SimulateOptions:
    workers: int = 4
    trial_ms: float = 1.0
    fail_rate: float = 0.0
    crash_rate: float = 0.0
    hang_rate: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class Spec:
    path: Path
    text: str
    name: str
    kernel: str
    problem: Mapping[str, Any]
    space: Mapping[str, list[Any]]
    constraints: tuple[Constraint, ...]
    timing: Timing
    validation: Tolerance | None
    run: RunOptions
    simulate: SimulateOptions
    kernel_source: str = ""  # SHA-256 of the kernel's source; empty for the simulate backend
    overridden: bool = field(default=False, compare=False)

    def expand(self) -> Space:
        space = expand(self.space, self.constraints)
        if len(space) == 0:
            raise SpecError(f"{self.path}: constraints: leave no config of the "
                            f"{space.size_before_constraints} in the space")
        return space

    def identity(self) -> dict[str, Any]:
        """What decides each trial's outcome; operational run settings are left out."""
        ident: dict[str, Any] = {
            "kernel": self.kernel, "kernel_source": self.kernel_source,
            "problem": dict(self.problem), "space": {k: list(v) for k, v in self.space.items()},
            "constraints": [c.text for c in self.constraints], "timing": asdict(self.timing),
            "validation": asdict(self.validation) if self.validation else None,
            "backend": self.run.backend, "seed": self.run.seed,
        }
        if self.run.backend == "simulate":
            sim = asdict(self.simulate)
            sim.pop("workers")
            ident["simulate"] = sim
        return ident

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest()[:16]

    def as_yaml(self) -> str:
        """The spec as run: its own text, or a normalised dump when the CLI overrode it."""
        if not self.overridden:
            return self.text
        doc = {
            "name": self.name, "kernel": self.kernel, "problem": dict(self.problem),
            "space": {k: list(v) for k, v in self.space.items()},
            "constraints": [c.text for c in self.constraints],
            "timing": {**asdict(self.timing), "screen": asdict(self.timing.screen)
                       if self.timing.screen else "off"},
            "validation": asdict(self.validation) if self.validation else "off",
            "run": asdict(self.run), "simulate": asdict(self.simulate),
        }
        return "# normalised by sweep: the command line overrode the original spec\n" + \
            yaml.safe_dump(doc, sort_keys=False)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (the last would win)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_mapping)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_off(v: Any) -> bool:
    return v is False or v == "off"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


Check = tuple[Callable[[Any], bool], str]
POSITIVE: Check = (lambda v: _is_number(v) and v > 0, "a number > 0")
NON_NEGATIVE: Check = (lambda v: _is_number(v) and v >= 0, "a number >= 0")
FRACTION: Check = (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1")
COUNT: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
AT_LEAST_ONE: Check = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
INTEGER: Check = (_is_int, "an integer")

_CHECKS: dict[type, dict[str, Check]] = {
    Timing: {"warmup_ms": NON_NEGATIVE, "rep_ms": POSITIVE},
    Screen: {"warmup_ms": NON_NEGATIVE, "rep_ms": POSITIVE},
    Tolerance: {"rtol": NON_NEGATIVE, "atol": NON_NEGATIVE},
    RunOptions: {
        "backend": (lambda v: v in BACKENDS, "one of " + ", ".join(BACKENDS)),
        "trial_timeout_s": POSITIVE, "max_retries": COUNT, "snapshot_every_s": POSITIVE,
        "drain_s": NON_NEGATIVE, "workers": (lambda v: v is None or AT_LEAST_ONE[0](v),
                                             "an integer >= 1 or null"),
        "seed": INTEGER, "finalist_rounds": AT_LEAST_ONE, "start_timeout_s": POSITIVE,
        "finalists": (lambda v: _is_int(v) and 0 <= v <= 16, "an integer from 0 to 16"),
    },
    SimulateOptions: {"workers": AT_LEAST_ONE, "trial_ms": NON_NEGATIVE, "fail_rate": FRACTION,
                      "crash_rate": FRACTION, "hang_rate": FRACTION, "seed": INTEGER},
}
TOP_KEYS = ("name", "kernel", "problem", "space", "constraints", "timing", "validation", "run",
            "simulate")


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> SpecError:
        return SpecError(f"{self.path}: {key}: {message}")

    def mapping(self, value: Any, key: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {value!r}")
        return value

    def section(self, cls: type, value: Any, key: str) -> Any:
        data = self.mapping(value, key)
        checks = _CHECKS[cls]
        names = [f.name for f in fields(cls)]
        for name, v in data.items():
            if name not in names:
                raise self.fail(f"{key}.{name}",
                                f"unknown key (expected one of {', '.join(names)})")
            ok, what = checks[name]
            if not ok(v):
                raise self.fail(f"{key}.{name}", f"expected {what}, got {v!r}")
        return cls(**data)


def load_spec(path: str | Path, *, backend: str | None = None) -> Spec:
    """Read, validate and resolve a spec file. backend overrides run.backend."""
    path = Path(path)
    r = _Reader(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}: {where}: invalid YAML ({problem})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a mapping of spec keys at the top level")
    for key in doc:
        if key not in TOP_KEYS:
            raise r.fail(str(key), f"unknown key (expected one of {', '.join(TOP_KEYS)})")
    for key in ("kernel", "space"):
        if key not in doc:
            raise r.fail(key, "required key is missing")

    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise r.fail("name", f"expected a non-empty string, got {name!r}")
    kernel_name = doc["kernel"]
    if not isinstance(kernel_name, str):
        raise r.fail("kernel", f"expected a string, got {kernel_name!r}")
    try:
        reference_of(kernel_name)
    except KernelError as e:
        raise r.fail("kernel", f"{e}, got {kernel_name!r}") from None

    raw_timing = dict(r.mapping(doc.get("timing"), "timing"))
    raw_screen = raw_timing.pop("screen", {})
    screen = None if _is_off(raw_screen) else r.section(Screen, raw_screen, "timing.screen")
    timing = replace(r.section(Timing, raw_timing, "timing"), screen=screen)
    raw_validation = doc.get("validation", {})
    if _is_off(raw_validation):
        validation = None
    else:
        validation = r.section(Tolerance, raw_validation, "validation")
    run = r.section(RunOptions, doc.get("run"), "run")
    if backend is not None:
        if backend not in BACKENDS:
            raise SpecError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        run = replace(run, backend=backend)
    simulate = r.section(SimulateOptions, doc.get("simulate"), "simulate")
    if simulate.fail_rate + simulate.crash_rate + simulate.hang_rate > 1:
        raise r.fail("simulate", "fail_rate + crash_rate + hang_rate must be at most 1")

    space = _read_space(r, doc["space"])
    constraints = _read_constraints(r, doc.get("constraints"), set(space))
    problem = r.mapping(doc.get("problem"), "problem")
    kernel_source = ""
    if run.backend != "simulate":
        try:
            kernel = load_kernel(kernel_name)
        except KernelError as e:
            raise r.fail("kernel", str(e)) from None
        problem = _check_problem(r, kernel, problem, run.backend)
        _check_parameters(r, kernel, space)
        kernel_source = source_digest(kernel_name, kernel)
    return Spec(path=path, text=text, name=name, kernel=kernel_name, problem=problem,
                space=space, constraints=constraints, timing=timing, validation=validation,
                run=run, simulate=simulate, kernel_source=kernel_source,
                overridden=backend is not None)


def _read_space(r: _Reader, value: Any) -> dict[str, list[Any]]:
    data = r.mapping(value, "space")
    if not data:
        raise r.fail("space", "expected at least one parameter")
    points = 1
    for name, values in data.items():
        key = f"space.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise r.fail(key, "a parameter name must be a Python identifier")
        if name in TABLE_COLUMNS:
            raise r.fail(key, "collides with a column of the trial table; rename the parameter")
        if not isinstance(values, list):
            raise r.fail(key, f"expected a list of values (write [{values!r}]), got {values!r}")
        if not values:
            raise r.fail(key, "expected at least one value, got an empty list")
        for v in values:
            if not isinstance(v, (bool, int, float, str)) or (
                    isinstance(v, float) and not math.isfinite(v)):
                raise r.fail(key, f"values must be numbers, strings or booleans, got {v!r}")
        if value_kind(values) is None:
            raise r.fail(key, f"values must all be of one type, got {values!r}")
        if len(set(values)) != len(values):
            raise r.fail(key, f"a value is listed twice in {values!r}")
        points *= len(values)
    if points > MAX_POINTS:
        raise r.fail("space", f"{points:,} points before constraints; at most {MAX_POINTS:,}")
    return data


def _read_constraints(r: _Reader, value: Any, parameters: set[str]) -> tuple[Constraint, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise r.fail("constraints", f"expected a list of expressions, got {value!r}")
    out = []
    for i, text in enumerate(value):
        key = f"constraints[{i}]"
        if not isinstance(text, str):
            raise r.fail(key, f"expected an expression string, got {text!r}")
        try:
            out.append(parse_constraint(text, parameters))
        except ConstraintError as e:
            raise r.fail(key, f"{text!r} {e}") from None
    return tuple(out)


def _check_problem(r: _Reader, kernel: Kernel, given: dict[str, Any], backend: str) -> dict:
    problem = dict(kernel.problem_defaults)
    for key, value in given.items():
        if key not in problem:
            known = ", ".join(problem)
            raise r.fail(f"problem.{key}", f"unknown key for kernel {kernel.name} "
                                           f"(expected one of {known})")
        default = problem[key]
        if key == "dtype":
            if value not in DTYPES:
                raise r.fail("problem.dtype", f"expected one of {', '.join(DTYPES)}, "
                                              f"got {value!r}")
        elif isinstance(default, bool) or type(value) is not type(default):
            raise r.fail(f"problem.{key}", f"expected {type(default).__name__}, got {value!r}")
        elif _is_number(value) and value <= 0:
            raise r.fail(f"problem.{key}", f"expected a number > 0, got {value!r}")
        problem[key] = value
    check_dtype_for_backend(r.path, problem, backend)
    return problem


def check_dtype_for_backend(path: Path, problem: Mapping[str, Any], backend: str) -> None:
    # Triton's CPU interpreter computes bfloat16 wrongly (seen with triton 3.9): every trial
    # would be recorded `incorrect`, so refuse up front.
    if backend == "interpret" and problem.get("dtype") == "bfloat16":
        raise SpecError(f"{path}: problem.dtype: bfloat16 is not supported by Triton's CPU "
                        "interpreter; use float16 or float32, or run on a GPU")


def _check_parameters(r: _Reader, kernel: Kernel, space: Mapping[str, list[Any]]) -> None:
    fn = getattr(kernel.fn, "fn", kernel.fn)
    params = inspect.signature(fn).parameters.values()
    constexprs = [p.name for p in params if "constexpr" in str(p.annotation)]
    required = [p.name for p in params
                if "constexpr" in str(p.annotation) and p.default is inspect.Parameter.empty]
    for name in space:
        if name not in constexprs and name not in LAUNCH_OPTIONS:
            raise r.fail(f"space.{name}", f"not a parameter of kernel {kernel.name} (expected "
                                          f"one of {', '.join(constexprs + list(LAUNCH_OPTIONS))})")
    missing = [c for c in required if c not in space]
    if missing:
        raise r.fail("space", f"kernel {kernel.name} needs a value list for "
                              f"{', '.join(missing)}")
