"""The typed, immutable spec and the names and limits it is checked against: one place
for them, so every reader and check of a spec agrees on what a valid one is."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from actors.backends import BACKENDS as REGISTRY
from actors.backends import CHOICES
from storage.records import canonical_json
from sweep.spec.constraints import Constraint
from sweep.spec.search_options import SearchOptions
from sweep.spec.space import (
    Space,
    SpaceTooLarge,
    concatenate,
    expand,
    expand_configs,
    union_space,
)
from sweep_kernels import CAPTURE

BACKEND_CHOICES = CHOICES  # run.backend, --backend and the API: auto and the registry's names
RUNTIMES = ("auto", "local", "ray")  # run.runtime and --runtime
# Backends that run no kernel code: nothing is imported for them.
KERNEL_FREE = tuple(name for name, b in REGISTRY.items() if not b.kernel)
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

    def screens(self, finalists: int) -> bool:
        """Whether each config's timing is a screen: finalists are re-timed afterwards."""
        return self.screen is not None and finalists > 0

    def per_config(self, finalists: int) -> tuple[float, float]:
        """(warmup_ms, rep_ms) of each config's timing: the screen's when finalists are
        re-timed afterwards, else the careful one."""
        if self.screen is not None and self.screens(finalists):
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
class OwnSpace:
    """What one problem tunes instead of the spec's space: `space:`'s value lists (a
    product), or `configs:`, an explicit list (then `space` holds the values each
    parameter takes over it)."""

    space: Mapping[str, list[Any]]
    configs: tuple[Mapping[str, Any], ...] = ()

    def as_written(self) -> dict[str, Any]:
        if self.configs:
            return {"configs": [dict(c) for c in self.configs]}
        return {"space": {k: list(v) for k, v in self.space.items()}}

    def expand(self, constraints: tuple[Constraint, ...], room: int) -> Space:
        """The configs that satisfy the constraints; SpaceTooLarge past room."""
        if not self.configs:
            return expand(self.space, constraints, max_configs=room)
        space = expand_configs(self.configs, constraints)
        if len(space) > room:
            raise SpaceTooLarge(len(space), len(self.configs), room)
        return space


@dataclass(frozen=True)
class Spec:
    path: Path
    text: str
    name: str
    kernel: str
    problem: Mapping[str, Any]  # with the kernel's defaults merged in
    problem_as_written: Mapping[str, Any]  # the file's own problem mapping
    # `space:` as written; with `configs:`, the values each parameter takes over them; with
    # neither (every problem tunes its own), every parameter of theirs with every value.
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
    # `problems:`: each entry as written (merged over problem_as_written when read), each
    # merged problem (with the kernel's defaults, once it is imported), the constraints
    # read against each, and each one's work per launch. Empty: one problem, `problem`.
    problem_entries: tuple[Mapping[str, Any], ...] = ()
    problems: tuple[Mapping[str, Any], ...] = ()
    problem_constraints: tuple[tuple[Constraint, ...], ...] = ()
    problem_work: tuple[Mapping[str, float], ...] = ()
    # `configs:`: the explicit list of configs tuned instead of space:'s product (`space`
    # then holds the values each parameter takes over it). Empty: the product.
    configs: tuple[Mapping[str, Any], ...] = ()
    # Each problem's own space (problems[i].space or .configs), None where it tunes the
    # spec's. Empty: every problem tunes the spec's. Where every problem has its own, the
    # spec has none and `space` holds every parameter's values over them all.
    problem_spaces: tuple[OwnSpace | None, ...] = ()

    @functools.cached_property  # once: read per problem and per entry
    def problem_keys(self) -> tuple[str, ...]:
        """The problem keys whose values differ between the problems, in the order they
        are first written: each is a column of the trial table."""
        keys: dict[str, None] = {}
        for entry in self.problem_entries:
            keys.update(dict.fromkeys(entry))
        if self.kernel.startswith(CAPTURE):  # a capture's table names each call's kernel
            return tuple(k for k in keys if k in ("kernel", "key"))
        return tuple(k for k in keys
                     if len({canonical_json(p.get(k)) for p in self.problems}) > 1)

    def each_problem(self) -> tuple[Mapping[str, Any], ...]:
        """Every problem the sweep tunes: `problems:`, or the one `problem`."""
        return self.problems or (self.problem,)

    @functools.cached_property
    def every_space(self) -> dict[str, list[Any]]:
        """Every parameter that the spec or any of its problems tunes, with every value."""
        return union_space([self.space, *(o.space for o in self.problem_spaces if o)])

    def own_space(self, problem: int | None = None) -> OwnSpace:
        """What the problem (or a sweep of one) tunes: its own space, or the spec's."""
        own = self.problem_spaces[problem] if problem is not None and self.problem_spaces \
            else None
        return own or OwnSpace(self.space, self.configs)

    def expand(self) -> Space:
        if self.problems:
            return self._expand_problems()
        try:
            space = self.own_space().expand(self.constraints, MAX_CONFIGS)
        except SpaceTooLarge as e:
            raise SpecError(f"{self.path}: space: {e}; add constraints or shorten the value "
                            "lists") from None
        if len(space) == 0:
            raise SpecError(f"{self.path}: constraints: leave no config of the "
                            f"{space.size_before_constraints} in the space")
        return space

    def _expand_problems(self) -> Space:
        parts = []
        room = MAX_CONFIGS
        for i, constraints in enumerate(self.problem_constraints):
            try:
                part = self.own_space(i).expand(constraints, room)
            except SpaceTooLarge as e:
                raise SpecError(f"{self.path}: problems: {e.configs:,} configs or more over "
                                f"the problems, at most {MAX_CONFIGS:,}; add constraints or "
                                "shorten the lists") from None
            if len(part) == 0:
                raise SpecError(f"{self.path}: constraints: leave no config of the "
                                f"{part.size_before_constraints} in the space for "
                                f"problems[{i}]")
            room -= len(part)
            parts.append(part)
        keys = self.problem_keys
        return concatenate(parts, keys, [[p[k] for k in keys] for p in self.problems])

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
        if self.problems:  # likewise
            ident["problems"] = [dict(p) for p in self.problems]
        if self.configs:  # likewise
            ident["configs"] = [dict(c) for c in self.configs]
        if self.problem_spaces:  # likewise
            ident["problem_spaces"] = [own.as_written() if own else None
                                       for own in self.problem_spaces]
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

    @functools.cached_property  # once: read per problem and per entry
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
        if self.problems:
            ident["problems"] = [dict(e) for e in self.problem_entries]
        return ident

    @functools.cached_property  # once: read per problem and per entry
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
            **({"problems": [{**e, **(own.as_written() if own else {})} for e, own in
                             zip(self.problem_entries, self.problem_spaces or
                                 [None] * len(self.problem_entries))]}
               if self.problem_entries else {}),
            "fixed": dict(self.fixed_as_written),
            **({} if self.problem_spaces and all(self.problem_spaces) else
               self.own_space().as_written()),
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
