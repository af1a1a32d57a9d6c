"""Loading and validating a sweep spec (YAML) into a typed, immutable Spec.

Every mistake is one SpecError line naming the file, the key (or the YAML line) and what
was expected; it is raised before any Ray or GPU work starts. Unknown keys are errors: a
typo must never fall back to a default silently. Values shown in a message are clipped, and
the file's size, nesting and aliases are bounded, so no input can make an error line, or
loading itself, huge.
"""

from __future__ import annotations

import hashlib
import inspect
import keyword
import math
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from storage.readback import ReadBackError, read_small
from storage.records import TABLE_COLUMNS, canonical_json
from storage.schema import REPLAY_COLUMNS
from sweep.spec.constraints import (
    Constraint,
    ConstraintError,
    clip_repr,
    clip_text,
    parse_constraint,
)
from sweep.spec.search_options import OPTIONS_OF, STRATEGIES, SearchOptions
from sweep.spec.space import Space, SpaceTooLarge, expand, parameter_kinds, value_kind
from sweep_kernels import (
    DTYPES,
    Kernel,
    KernelError,
    load_kernel,
    reference_of,
    source_digest,
    source_files,
)

BACKENDS = ("auto", "cuda", "interpret", "simulate", "replay")
RUNTIMES = ("auto", "local", "ray")  # run.runtime and --runtime
# Backends that run no kernel code: nothing is imported for them.
KERNEL_FREE = ("simulate", "replay")
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
MAX_POINTS = 50_000_000  # before constraints
MAX_CONFIGS = 5_000_000  # after constraints
MAX_SPEC_BYTES = 1 << 20
# A replayed trial table is read whole, once: millions of rows, not a device's endless bytes.
REPLAY_TABLE_LIMIT = 4 << 30
MAX_NESTING = 64  # YAML collections inside collections
MAX_NAME_CHARS = 100
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


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
    # How long one compile may take: "auto" (a limit learnt from this run's compile times,
    # at most trial_timeout_s; see sweep/search/scheduling.py), seconds, or "off" (trial_timeout_s).
    compile_timeout_s: float | str = "auto"
    # Ray accelerator types (H100, A100, ...; for simulate, simulate.devices' names) a
    # sweep may run on; None: every GPU of the cluster, of whatever type.
    accelerator_types: tuple[str, ...] | None = None
    # Where the workers run: "local" (processes of this machine), "ray", or "auto"
    # (Ray where an address or a `ray start` head says so; see sweep/engines/selection.py).
    runtime: str = "auto"

    @property
    def compile_limit_s(self) -> float:
        """The fixed compile limit: the adaptive one never goes above it."""
        if isinstance(self.compile_timeout_s, str):
            return self.trial_timeout_s
        return min(self.compile_timeout_s, self.trial_timeout_s)


@dataclass(frozen=True)
class SimulateOptions:
    workers: int = 4
    trial_ms: float = 1.0
    fail_rate: float = 0.0
    crash_rate: float = 0.0
    hang_rate: float = 0.0
    seed: int = 0
    # Simulated device types and how many workers each (instead of `workers`): each type
    # has latencies of its own, as GPUs of different types do.
    devices: Mapping[str, int] = field(default_factory=dict)
    # Ray resources each simulated worker asks for (a custom one standing in for a GPU
    # spreads workers over the nodes of a test cluster).
    resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayOptions:
    """The replay backend: a recorded trial table played back on simulated GPUs and
    compile slots (actors/replay.py)."""

    table: str = ""  # a trials.parquet; relative paths are from the spec's directory
    workers: int = 4
    compile_slots: int = 4  # per simulated GPU
    time_scale: float = 1.0  # recorded seconds are multiplied by this




@dataclass(frozen=True)
class Spec:
    path: Path
    text: str
    name: str
    kernel: str
    problem: Mapping[str, Any]  # with the kernel's defaults merged in
    problem_as_written: Mapping[str, Any]  # the file's own problem mapping
    space: Mapping[str, list[Any]]
    constraints: tuple[Constraint, ...]
    timing: Timing
    validation: Tolerance | None
    run: RunOptions
    simulate: SimulateOptions
    kernel_source: str = ""  # SHA-256 of the kernel's source; empty for the simulate backend
    overridden: bool = field(default=False, compare=False)
    replay: ReplayOptions = ReplayOptions()
    replay_source: str = ""  # SHA-256 of the replayed table's bytes
    # The kernel's work per launch for this problem, where it says (flops, bytes_moved):
    # recorded with the run for TFLOP/s and GB/s in reports. Known once it is imported.
    work: Mapping[str, float] = field(default_factory=dict)
    # Keyword arguments of the kernel that are not tuned: passed on every launch and
    # compile, never part of a config. With the kernel record's defaults merged in.
    fixed: Mapping[str, Any] = field(default_factory=dict)
    fixed_as_written: Mapping[str, Any] = field(default_factory=dict)  # the file's own
    search: SearchOptions = field(default_factory=SearchOptions)
    # The kernel's source files and their digests (sweep_kernels.source_files), once it is
    # imported: what the best-config cache records to answer without importing it.
    kernel_files: Mapping[str, str] = field(default_factory=dict, compare=False)

    def expand(self) -> Space:
        try:
            space = expand(self.space, self.constraints, max_configs=MAX_CONFIGS)
        except SpaceTooLarge as e:
            raise SpecError(f"{self.path}: space: {e}; add constraints or shorten the value "
                            "lists") from None
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
        if self.fixed:  # only then: runs from before fixed values keep their fingerprints
            ident["fixed"] = dict(self.fixed)
        if self.run.backend == "simulate":
            sim = asdict(self.simulate)
            for operational in ("workers", "resources", "devices"):
                sim.pop(operational)
            if self.simulate.devices:  # each type has latencies of its own; not its count
                sim["devices"] = sorted(self.simulate.devices)
            ident["simulate"] = sim
        if self.run.backend == "replay":
            ident["replay"] = self.replay_source
        if not self.search.exhaustive:  # only then: exhaustive runs keep their fingerprints
            ident["search"] = asdict(self.search)
        return ident

    @property
    def fingerprint(self) -> str:
        return _digest(self.identity())

    def declared_identity(self) -> dict[str, Any]:
        """identity() as the file alone decides it: the problem as written, no kernel
        source. Computable without importing the kernel (load_spec(import_kernel=False))."""
        ident = self.identity()
        del ident["kernel_source"]
        ident["problem"] = dict(self.problem_as_written)
        ident.pop("fixed", None)
        if self.fixed_as_written:
            ident["fixed"] = dict(self.fixed_as_written)
        return ident

    @property
    def declared_fingerprint(self) -> str:
        """The same for a file whether or not its kernel was imported: lets `sweep resume`
        check a run's spec before running any code it names."""
        return _digest(self.declared_identity())

    def as_yaml(self) -> str:
        """The spec as run: its own text, or a normalised dump when the CLI overrode it."""
        if not self.overridden:
            return self.text
        doc = {
            # As written: reloading the dump gives the same declared_fingerprint, and
            # merging the kernel's defaults again the same fingerprint.
            "name": self.name, "kernel": self.kernel, "problem": dict(self.problem_as_written),
            "fixed": dict(self.fixed_as_written),
            "space": {k: list(v) for k, v in self.space.items()},
            "constraints": [c.text for c in self.constraints],
            "timing": {**asdict(self.timing), "screen": asdict(self.timing.screen)
                       if self.timing.screen else "off"},
            "validation": asdict(self.validation) if self.validation else "off",
            "run": {**asdict(self.run), "accelerator_types": list(self.run.accelerator_types)
                    if self.run.accelerator_types is not None else None},
            "simulate": asdict(self.simulate),
            "replay": asdict(self.replay),
            "search": self.search.own(),
        }
        return "# normalised by sweep: the command line overrode the original spec\n" + \
            yaml.safe_dump(doc, sort_keys=False)


def _digest(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:16]


class _Refused(yaml.MarkedYAMLError):
    """YAML that parses but that a spec does not allow; the message names its line."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


_STR_TAG = "tag:yaml.org,2002:str"


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader for a spec. Refuses aliases (nested ones expand exponentially: a few
    hundred bytes can become gigabytes), deep nesting, mapping keys that are not strings,
    a key given twice in one mapping (the last would win), integers beyond int64 and lone
    surrogates (neither survives numpy, JSON or UTF-8 later)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _Refused("YAML aliases are not supported in a spec",
                           self.peek_event().start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise _Refused(f"nested more than {MAX_NESTING} levels deep",
                               self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
            # PyYAML's own constructors raise these for explicitly tagged values they
            # cannot read, such as `!!int abc` or `!!bool ''`.
            kind = str(node.tag).rpartition(":")[2]
            raise _Refused(f"cannot read {clip_repr(node.value, 40)} as {kind} "
                           f"({type(e).__name__})", node.start_mark) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(f"mapping keys must be strings, got a "
                               f"{type(key_node).__name__[:-4].lower()}", key_node.start_mark)
            if key_node.tag != _STR_TAG:
                kind = key_node.tag.rpartition(":")[2]
                text = clip_text(key_node.value, 40)
                raise _Refused(f"mapping keys must be strings; YAML reads {text} as {kind}, "
                               f"not a string (quote it: '{text}')", key_node.start_mark)
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {clip_repr(key_node.value)} given twice",
                    key_node.start_mark)
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)

    def construct_int64(self, node: Any) -> int:
        # Checked before int() runs: a long digit string is slow to convert, and beyond
        # 4300 digits Python refuses it with a ValueError.
        text = node.value.replace("_", "") if isinstance(node.value, str) else ""
        value = self.construct_yaml_int(node) if len(text) <= 70 else None
        if value is None or not INT64_MIN <= value <= INT64_MAX:
            raise _Refused(f"the integer {clip_text(text, 40)} does not fit in 64 bits "
                           "(from -2**63 to 2**63 - 1)", node.start_mark)
        return value

    def construct_unicode(self, node: Any) -> str:
        value = self.construct_yaml_str(node)
        try:
            value.encode()
        except UnicodeEncodeError:
            raise _Refused(f"the string {clip_repr(value)} holds a lone surrogate; a spec "
                           "must be valid Unicode", node.start_mark) from None
        return value


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_int64)
_SpecLoader.add_constructor(_STR_TAG, _SpecLoader.construct_unicode)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_label(v: Any) -> bool:
    """A device type or resource name: short, printable, no separators of Ray's."""
    return isinstance(v, str) and 0 < len(v) <= 64 and v.isprintable() and \
        not any(c in v for c in ":,{}[] ")


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
                    "seed": COUNT, "budget": (lambda v: _is_number(v) and 0 < v <= 1,
                                                "a fraction > 0 and at most 1"),
                    "patience": FRACTION, "improvement": FRACTION,
                    "batch": (lambda v: v is None or AT_LEAST_ONE[0](v),
                              "an integer >= 1 or null (sized to the cluster)"),
                    "sample": (lambda v: _is_number(v) and 0 < v <= 1,
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
TOP_KEYS = ("name", "kernel", "problem", "fixed", "space", "constraints", "timing",
            "validation", "run", "simulate", "replay", "search")


class _Reader:
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
                raise self.fail(f"{key}.{name}", f"expected {what}, got {clip_repr(v)}")
        return cls(**data)


def _read_text(path: Path, source: Path) -> str:
    try:
        with source.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than 1 MiB ({MAX_SPEC_BYTES:,} bytes), the most a "
                        "spec may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SpecError(f"{path}: not UTF-8 text ({e.reason}: byte 0x{data[e.start]:02x} on "
                        f"line {line}); save the file as UTF-8") from None


def _parse_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_SpecLoader)
    except _Refused as e:
        raise SpecError(f"{path}: line {e.problem_mark.line + 1}: {e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}: {where}: invalid YAML ({clip_text(problem, 200)})") from None
    except (RecursionError, MemoryError) as e:  # bounded above; kept as a last resort
        raise SpecError(f"{path}: YAML too complex to load ({type(e).__name__})") from None


def read_spec_text(path: str | Path, cwd: Path | None = None) -> str:
    """A spec file's text, to load it from more than once (a pipe, `<(...)`, reads once)."""
    path = Path(path)
    return _read_text(path, cwd / path if cwd is not None else path)


def load_spec(path: str | Path, *, backend: str | None = None,
              import_kernel: bool = True, cwd: Path | None = None,
              text: str | None = None) -> Spec:
    """Read, validate and resolve a spec file. backend overrides run.backend.

    import_kernel=False checks everything the file alone decides and runs no code it
    names: the kernel module is not imported, so neither the problem nor the fixed values
    are merged with its defaults, nor the space and fixed names checked against its
    signature, and kernel_source stays "".
    declared_fingerprint is the same either way.

    cwd: the directory a relative path is read from (not the process's current one, which
    another thread may change meanwhile); messages name the path as given.
    text: the file's text as read_spec_text read it (relative paths in it are still
    taken from the file's directory).
    """
    path = Path(path)
    r = _Reader(path, cwd / path if cwd is not None else path)
    if text is None:
        text = _read_text(path, r.source)
    doc = _parse_yaml(path, text)
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a mapping of spec keys at the top level")
    for key in doc:
        if key not in TOP_KEYS:
            raise r.fail(key, f"unknown key (expected one of {', '.join(TOP_KEYS)})")
    for key in ("kernel", "space"):
        if key not in doc:
            raise r.fail(key, "required key is missing")

    # A long file name is no mistake in the spec: only its start names the run.
    name = _read_name(r, doc.get("name", path.stem[:MAX_NAME_CHARS]))
    kernel_name = _read_kernel(r, doc["kernel"])

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
    if run.accelerator_types is not None:
        run = replace(run, accelerator_types=tuple(run.accelerator_types))
    if backend is not None:
        if backend not in BACKENDS:
            raise SpecError(f"--backend: expected one of {', '.join(BACKENDS)}, "
                            f"got {clip_repr(backend)}")
        run = replace(run, backend=backend)
    simulate = r.section(SimulateOptions, doc.get("simulate"), "simulate")
    if simulate.fail_rate + simulate.crash_rate + simulate.hang_rate > 1:
        raise r.fail("simulate", "fail_rate + crash_rate + hang_rate must be at most 1")

    search = _read_search(r, doc.get("search"))
    space = _read_space(r, doc["space"])
    problem_as_written = _read_problem(r, doc.get("problem"))
    fixed_as_written = _read_fixed(r, doc.get("fixed"), space)
    constraints = _read_constraints(r, doc.get("constraints"), parameter_kinds(space),
                                    problem_as_written, fixed_as_written)
    problem = dict(problem_as_written)
    fixed = dict(fixed_as_written)
    # Checked whatever the backend, as simulate is; the table is read only to replay it.
    replay, replay_source = r.section(ReplayOptions, doc.get("replay"), "replay"), ""
    written_table = replay.table
    if run.backend == "replay":
        replay, replay_source = _read_replay(r, replay)
    kernel_source, work, kernel_files = "", {}, {}
    if run.backend not in KERNEL_FREE and import_kernel:
        try:
            kernel = load_kernel(kernel_name)
        except KernelError as e:
            raise r.fail("kernel", clip_text(str(e), 300)) from None
        problem = _check_problem(r, kernel, problem, run.backend)
        fixed = _check_fixed(r, kernel, fixed, space)
        _check_parameters(r, kernel, space, fixed)
        kernel_source = source_digest(kernel_name, kernel)
        kernel_files = source_files(kernel_name, kernel)
        work = _work(kernel, problem)
    return Spec(path=path, text=text, name=name, kernel=kernel_name, problem=problem,
                problem_as_written=problem_as_written, space=space, constraints=constraints,
                timing=timing, validation=validation, run=run, simulate=simulate,
                kernel_source=kernel_source, fixed=fixed, fixed_as_written=fixed_as_written,
                # A relative table path would not survive the copy into the run directory.
                overridden=backend is not None or replay.table != written_table,
                replay=replay, replay_source=replay_source, work=work, search=search,
                kernel_files=kernel_files)


def _read_search(r: _Reader, value: Any) -> SearchOptions:
    """`search: guided`, or a mapping with `strategy` and that strategy's options."""
    if isinstance(value, str) or value is None:
        value = {"strategy": value or "exhaustive"}
    if not isinstance(value, dict):
        raise r.fail("search", f"expected a strategy ({', '.join(STRATEGIES)}) or a mapping "
                               f"of options, got {clip_repr(value)}")
    options: SearchOptions = r.section(SearchOptions, value, "search")
    for key in value:
        owners = OPTIONS_OF.get(key, (options.strategy,))
        if options.strategy not in owners:
            raise r.fail(f"search.{key}", f"applies to strategy {' and '.join(owners)} "
                                          f"only, not {options.strategy}")
    return options


def _work(kernel: Kernel, problem: Mapping[str, Any]) -> dict[str, float]:
    """What the kernel says it does per launch. A function that fails or answers nonsense
    costs the report its throughput figures, never the run."""
    out = {}
    for key in ("flops", "bytes_moved"):
        fn = getattr(kernel, key)
        try:
            value = float(fn(problem)) if fn is not None else None
        except Exception:
            value = None
        if value is not None and math.isfinite(value) and value > 0:
            out[key] = value
    return out


def _read_replay(r: _Reader, options: ReplayOptions) -> tuple[ReplayOptions, str]:
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


def _read_name(r: _Reader, name: Any) -> str:
    """The run's name, which becomes a directory under runs/ (see rundir.default_out)."""
    problem = name_problem(name)
    if problem is not None:
        raise r.fail("name", problem)
    return str(name)


def name_problem(name: Any) -> str | None:
    """What makes `name` no run's name (None: nothing): run.json's is checked by the same
    rule as a spec's."""
    if not isinstance(name, str) or not name:
        return f"expected a non-empty string, got {clip_repr(name)}"
    if len(name) > MAX_NAME_CHARS:
        return f"expected at most {MAX_NAME_CHARS} characters, got {len(name):,}"
    if name in (".", ".."):
        return f"expected a name for the run directory, got {name!r}"
    for c in name:
        if c in "/\\" or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            return f"{c!r} cannot be part of the run directory's name, got {clip_repr(name)}"
    return None


def _read_kernel(r: _Reader, kernel_name: Any) -> str:
    if not isinstance(kernel_name, str):
        raise r.fail("kernel", f"expected a string, got {clip_repr(kernel_name)}")
    try:
        module = reference_of(kernel_name).partition(":")[0]
    except KernelError as e:
        raise r.fail("kernel", f"{e}, got {clip_repr(kernel_name)}") from None
    if not all(part.isidentifier() for part in module.split(".")):
        # importlib would raise TypeError for a relative name such as ".mod".
        raise r.fail("kernel", "expected 'package.module:attr' with a module path of Python "
                               f"identifiers, got {clip_repr(kernel_name)}")
    return kernel_name


def _is_json_scalar(v: Any) -> bool:
    return isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))


def _read_problem(r: _Reader, value: Any) -> dict[str, Any]:
    # Checked for every backend: the simulate backend checks nothing against a kernel, yet
    # the problem still goes into canonical JSON (fingerprints, the best-config cache).
    problem = r.mapping(value, "problem")
    for key, v in problem.items():
        if not _is_json_scalar(v):
            raise r.fail(f"problem.{key}", "expected a string, an integer, a finite number or "
                                           f"a boolean, got {clip_repr(v)}")
    return problem


def _read_space(r: _Reader, value: Any) -> dict[str, list[Any]]:
    data = r.mapping(value, "space")
    if not data:
        raise r.fail("space", "expected at least one parameter")
    points = 1
    for name, values in data.items():
        key = f"space.{name}"
        if not name.isidentifier():
            raise r.fail(key, "a parameter name must be a Python identifier")
        if keyword.iskeyword(name):
            raise r.fail(key, "a Python keyword cannot be a parameter name")
        normal = unicodedata.normalize("NFKC", name)
        if normal != name:
            # Python's parser normalises identifiers, so no constraint could name it.
            raise r.fail(key, f"Python reads this name as {clip_repr(normal)}; write that")
        if name in TABLE_COLUMNS:
            raise r.fail(key, "collides with a column of the trial table; rename the parameter")
        if not isinstance(values, list):
            shown = clip_repr(values)
            raise r.fail(key, f"expected a list of values (write [{shown}]), got {shown}")
        if not values:
            raise r.fail(key, "expected at least one value, got an empty list")
        for v in values:
            if not isinstance(v, (bool, int, float, str)) or (
                    isinstance(v, float) and not math.isfinite(v)):
                raise r.fail(key, "values must be numbers, strings or booleans, "
                                  f"got {clip_repr(v)}")
        if value_kind(values) is None:
            raise r.fail(key, f"values must all be of one type, got {clip_repr(values)}")
        if len(set(values)) != len(values):
            raise r.fail(key, f"a value is listed twice in {clip_repr(values)}")
        points *= len(values)
    if points > MAX_POINTS:
        raise r.fail("space", f"{points:,} points before constraints; at most {MAX_POINTS:,}")
    return data


def _read_fixed(r: _Reader, value: Any, space: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The spec's fixed values: what the file alone decides; checked against the kernel's
    signature once it is imported (_check_fixed)."""
    fixed = r.mapping(value, "fixed")
    for name, v in fixed.items():
        key = f"fixed.{name}"
        if not name.isidentifier() or keyword.iskeyword(name):
            raise r.fail(key, "expected the name of a keyword argument of the kernel (a "
                              "Python identifier)")
        normal = unicodedata.normalize("NFKC", name)
        if normal != name:
            raise r.fail(key, f"Python reads this name as {clip_repr(normal)}; write that")
        if name in space:
            raise r.fail(key, "also in space; a parameter is either tuned or fixed")
        if name in LAUNCH_OPTIONS:
            raise r.fail(key, f"{name} is a launch option; give it in space (as a one-value "
                              f"list: {name}: [{clip_text(str(v), 20)}])")
        if not _is_json_scalar(v):
            raise r.fail(key, "expected a string, an integer, a finite number or a boolean, "
                              f"got {clip_repr(v)}")
    return fixed


def _read_constraints(r: _Reader, value: Any, parameters: Mapping[str, type],
                      problem: Mapping[str, Any],
                      fixed: Mapping[str, Any]) -> tuple[Constraint, ...]:
    """Constraints over the parameters and, as constants, the problem and fixed values the
    spec writes (a kernel's defaults are not known yet: the space is expanded before the
    kernel is imported). A parameter wins over a constant of its name, a fixed value over
    a problem value."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise r.fail("constraints", f"expected a list of expressions, got {clip_repr(value)}")
    constants = {**problem, **fixed}
    unknown = (f"expected a parameter ({clip_text(', '.join(parameters), 200)}), or a value "
               f"written under problem: ({clip_text(', '.join(problem), 200) or 'none'}) or "
               f"fixed: ({clip_text(', '.join(fixed), 200) or 'none'})")
    out = []
    for i, text in enumerate(value):
        key = f"constraints[{i}]"
        if not isinstance(text, str):
            raise r.fail(key, f"expected an expression string, got {clip_repr(text)}")
        try:
            out.append(parse_constraint(text, parameters, constants, unknown=unknown))
        except ConstraintError as e:
            raise r.fail(key, f"{clip_repr(text)} {e}") from None
    return tuple(out)


def _check_problem(r: _Reader, kernel: Kernel, given: dict[str, Any],
                   backend: str) -> dict[str, Any]:
    problem = dict(kernel.problem_defaults)
    for key, value in given.items():
        if key not in problem:
            known = clip_text(", ".join(problem), 200)
            raise r.fail(f"problem.{key}", f"unknown key for kernel {kernel.name} "
                                           f"(expected one of {known})")
        default = problem[key]
        if key == "dtype":
            if value not in DTYPES:
                raise r.fail("problem.dtype", f"expected one of {', '.join(DTYPES)}, "
                                              f"got {clip_repr(value)}")
        elif isinstance(default, bool) or type(value) is not type(default):
            raise r.fail(f"problem.{key}", f"expected {type(default).__name__}, "
                                           f"got {clip_repr(value)}")
        elif _is_number(value) and value <= 0:
            raise r.fail(f"problem.{key}", f"expected a number > 0, got {clip_repr(value)}")
        problem[key] = value
    check_dtype_for_backend(r.path, problem, backend)
    return problem


def check_dtype_for_backend(path: Path, problem: Mapping[str, Any], backend: str) -> None:
    # Triton's CPU interpreter computes bfloat16 wrongly (seen with triton 3.9): every trial
    # would be recorded `incorrect`, so refuse up front.
    if backend == "interpret" and problem.get("dtype") == "bfloat16":
        raise SpecError(f"{path}: problem.dtype: bfloat16 is not supported by Triton's CPU "
                        "interpreter; use float16 or float32, or run on a GPU")


def _signature(kernel: Kernel) -> list[inspect.Parameter]:
    fn = getattr(kernel.fn, "fn", kernel.fn)  # JITFunction wraps the Python function
    return list(inspect.signature(fn).parameters.values())


def _keywords(kernel: Kernel) -> list[str]:
    """What may be fixed: a constexpr, or a parameter with a default (a scalar such as
    eps). The others (pointers, sizes, strides) are launch_args' to pass, by position: a
    fixed value for one would fail every trial with "multiple values for argument"."""
    return [p.name for p in _signature(kernel)
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and ("constexpr" in str(p.annotation) or p.default is not inspect.Parameter.empty)]


def _check_fixed(r: _Reader, kernel: Kernel, written: Mapping[str, Any],
                 space: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The kernel record's fixed values with the spec's over them. A default the spec tunes
    is dropped: tuning a parameter overrides its default, as a spec's value does."""
    keywords = _keywords(kernel)
    names = clip_text(", ".join(keywords), 300)
    for name, v in kernel.fixed.items():
        if name not in keywords or not _is_json_scalar(v):
            raise r.fail("kernel", f"kernel {kernel.name}'s own fixed value "
                                   f"{clip_repr(name, 40)}: {clip_repr(v, 40)}: expected one "
                                   f"of its function's parameters ({names}) with a string, an "
                                   "integer, a finite number or a boolean")
    every = [p.name for p in _signature(kernel)]
    for name in written:
        if name in every and name not in keywords:
            raise r.fail(f"fixed.{name}", f"kernel {kernel.name} gets it from launch_args, by "
                                          "position; fixed: takes its tl.constexpr parameters "
                                          f"and those with a default ({names})")
        if name not in keywords:
            raise r.fail(f"fixed.{name}", f"not a parameter of kernel {kernel.name} "
                                          f"(expected one of {names})")
    return {**{k: v for k, v in kernel.fixed.items() if k not in space}, **written}


def _check_parameters(r: _Reader, kernel: Kernel, space: Mapping[str, list[Any]],
                      fixed: Mapping[str, Any]) -> None:
    params = _signature(kernel)
    constexprs = [p.name for p in params if "constexpr" in str(p.annotation)]
    required = [p.name for p in params
                if "constexpr" in str(p.annotation) and p.default is inspect.Parameter.empty]
    for name in space:
        if name not in constexprs and name not in LAUNCH_OPTIONS:
            raise r.fail(f"space.{name}", f"not a parameter of kernel {kernel.name} (expected "
                                          f"one of {', '.join(constexprs + list(LAUNCH_OPTIONS))})")
    missing = [c for c in required if c not in space and c not in fixed]
    if missing:
        raise r.fail("space", f"kernel {kernel.name} needs a value list (or a value under "
                              f"fixed:) for {', '.join(missing)}")
