"""Reading each top-level key of a spec into its typed value, where a key needs more than
the rule table: how its parts relate to each other and to the file's other keys."""

from __future__ import annotations

import keyword
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from storage.records import TABLE_COLUMNS, canonical_json
from sweep.spec.constraints import (
    Constraint,
    ConstraintError,
    clip_repr,
    clip_text,
    parse_constraint,
)
from sweep.spec.model import (
    BACKEND_CHOICES,
    LAUNCH_OPTIONS,
    MAX_NAME_CHARS,
    MAX_POINTS,
    OwnSpace,
    RunOptions,
    Screen,
    SimulateOptions,
    SpecError,
    Timing,
    Tolerance,
)
from sweep.spec.rules import Reader, is_json_scalar, is_off
from sweep.spec.search_options import OPTIONS_OF, STRATEGIES, SearchOptions
from sweep.spec.space import value_kind
from sweep_kernels import CAPTURE, KernelError, capture_path, reference_of


def read_timing(r: Reader, value: Any) -> Timing:
    raw_timing = dict(r.mapping(value, "timing"))
    raw_screen = raw_timing.pop("screen", {})
    screen = None if is_off(raw_screen) else r.section(Screen, raw_screen, "timing.screen")
    return replace(r.section(Timing, raw_timing, "timing"), screen=screen)


def read_validation(r: Reader, value: Any) -> Tolerance | None:
    if is_off(value):
        return None
    return r.section(Tolerance, value, "validation")


def read_run(r: Reader, value: Any, backend: str | None) -> RunOptions:
    """run:, with the command line's backend (if any) over run.backend."""
    run = r.section(RunOptions, value, "run")
    if run.accelerator_types is not None:
        run = replace(run, accelerator_types=tuple(run.accelerator_types))
    if backend is not None:
        if backend not in BACKEND_CHOICES:
            raise SpecError(f"--backend: expected one of {', '.join(BACKEND_CHOICES)}, "
                            f"got {clip_repr(backend)}")
        run = replace(run, backend=backend)
    return run


def read_simulate(r: Reader, value: Any) -> SimulateOptions:
    simulate = r.section(SimulateOptions, value, "simulate")
    if simulate.fail_rate + simulate.crash_rate + simulate.hang_rate > 1:
        raise r.fail("simulate", "fail_rate + crash_rate + hang_rate must be at most 1")
    return simulate


def read_search(r: Reader, value: Any) -> SearchOptions:
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


def read_name(r: Reader, name: Any) -> str:
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


def read_kernel(r: Reader, kernel_name: Any) -> str:
    if not isinstance(kernel_name, str):
        raise r.fail("kernel", f"expected a string, got {clip_repr(kernel_name)}")
    try:
        module = reference_of(kernel_name).partition(":")[0]
    except KernelError as e:
        raise r.fail("kernel", f"{e}, got {clip_repr(kernel_name)}") from None
    path = capture_path(kernel_name)
    if path is not None:  # from the spec's folder, as the run's copy of the spec must say
        return CAPTURE + str((r.source.parent / path).resolve())
    if not all(part.isidentifier() for part in module.split(".")):
        # importlib would raise TypeError for a relative name such as ".mod".
        raise r.fail("kernel", "expected 'package.module:attr' with a module path of Python "
                               f"identifiers, got {clip_repr(kernel_name)}")
    return kernel_name


def read_problem(r: Reader, value: Any) -> dict[str, Any]:
    # Checked for every backend: the simulate backend checks nothing against a kernel, yet
    # the problem still goes into canonical JSON (fingerprints, the best-config cache).
    problem = r.mapping(value, "problem")
    for key, v in problem.items():
        if not is_json_scalar(v):
            raise r.fail(f"problem.{key}", "expected a string, an integer, a finite number or "
                                           f"a boolean, got {clip_repr(v)}")
    return problem


def read_own_spaces(r: Reader, value: Any) -> tuple[Any, tuple[OwnSpace | None, ...]]:
    """Each `problems:` entry's own `space:` or `configs:`, taken out of it (its other keys
    stay problem keys), None where it has neither; () when none has."""
    if not isinstance(value, list):
        return value, ()  # read_problems says what is wrong
    entries: list[Any] = []
    own: list[OwnSpace | None] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or not {"space", "configs"} & entry.keys():
            entries.append(entry)
            own.append(None)
            continue
        key = f"problems[{i}]"
        if "space" in entry and "configs" in entry:
            raise r.fail(f"{key}.configs", "give space: (value lists, tuned as their "
                                           "product) or configs: (an explicit list of "
                                           "configs), not both")
        if "configs" in entry:
            configs, values = read_configs(r, entry["configs"], f"{key}.configs")
            own.append(OwnSpace(values, configs))
        else:
            own.append(OwnSpace(read_space(r, entry["space"], f"{key}.space")))
        entries.append({k: v for k, v in entry.items() if k not in ("space", "configs")})
    return entries, tuple(own) if any(own) else ()


def read_problems(r: Reader, value: Any, problem: Mapping[str, Any],
                  spaces: Sequence[Mapping[str, list[Any]]],
                  fixed: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """`problems:`, each entry merged over `problem:` (which holds what they share): a
    non-empty list of mappings, no two alike, none naming a parameter (of the space it
    tunes, spaces[i]) or a fixed value."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise r.fail("problems", "expected a non-empty list of mappings (each merged over "
                                 f"problem:), got {clip_repr(value)}")
    merged: list[dict[str, Any]] = []
    for i, entry in enumerate(value):
        key = f"problems[{i}]"
        if not isinstance(entry, dict):
            raise r.fail(key, f"expected a mapping of problem keys, got {clip_repr(entry)}")
        space = spaces[i]
        for name, v in entry.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise r.fail(key, f"expected identifier keys, got {clip_repr(name)}")
            if not is_json_scalar(v):
                raise r.fail(f"{key}.{name}", "expected a string, an integer, a finite "
                                              f"number or a boolean, got {clip_repr(v)}")
            if name in space or name in fixed:
                where = "space:" if name in space else "fixed:"
                raise r.fail(f"{key}.{name}", f"also set under {where}; a problem key "
                                              "cannot be tuned or fixed")
            refuse_column_clash(r, f"{key}.{name}", name, "the problem key")
        merged.append({**problem, **entry})
    _refuse_unlike_problems(r, merged)
    return tuple(merged)


def refuse_column_clash(r: Reader, key: str, name: str, what: str) -> None:
    """A parameter or a problem key becomes a column of the trial table beside the
    record's own, so it may not share a name with one (it would overwrite it)."""
    if name in TABLE_COLUMNS:
        raise r.fail(key, f"collides with a column of the trial table; rename {what}")


def _refuse_unlike_problems(r: Reader, merged: list[dict[str, Any]]) -> None:
    """Every problem sets the same keys (else a kernel's default would fill one in
    silently), each key's values share one type as a space's values do (a column holds
    one type: 1 and "1" would both become "1"), and no two problems are alike. Linear
    in the problems: a problem is compared through its canonical form, once."""
    first_with: dict[str, int] = {}
    for i, whole in enumerate(merged):
        for k in whole:
            first_with.setdefault(k, i)
    kinds: dict[str, type] = {}
    for i, whole in enumerate(merged):
        missing = [k for k in first_with if k not in whole]
        if missing:
            raise r.fail(f"problems[{i}]", f"no value for {missing[0]}, which "
                                           f"problems[{first_with[missing[0]]}] sets; set it "
                                           "in every problem, or under problem: for all")
        for k, v in whole.items():
            kind = value_kind([kinds.setdefault(k, _kind(v))(), v])  # int widens to float
            if kind is None:
                raise r.fail(f"problems[{i}].{k}", f"expected {kinds[k].__name__} as "
                                                   f"problems[{first_with[k]}].{k} is, got "
                                                   f"{clip_repr(v)}; a key's values share "
                                                   "one type")
            kinds[k] = kind
    seen: dict[str, int] = {}
    for i, whole in enumerate(merged):
        form = canonical_json({k: kinds[k](v) for k, v in whole.items()})
        if form in seen:
            raise r.fail(f"problems[{i}]", f"the same problem as problems[{seen[form]}]")
        seen[form] = i


def _kind(v: Any) -> type:
    return bool if isinstance(v, bool) else type(v)


def read_space(r: Reader, value: Any, where: str = "space") -> dict[str, list[Any]]:
    data = r.mapping(value, where)
    if not data:
        raise r.fail(where, "expected at least one parameter")
    points = 1
    for name, values in data.items():
        key = f"{where}.{name}"
        check_parameter_name(r, key, name)
        if not isinstance(values, list):
            shown = clip_repr(values)
            raise r.fail(key, f"expected a list of values (write [{shown}]), got {shown}")
        if not values:
            raise r.fail(key, "expected at least one value, got an empty list")
        for v in values:
            if not _is_value(v):
                raise r.fail(key, "values must be numbers, strings or booleans, "
                                  f"got {clip_repr(v)}")
        if value_kind(values) is None:
            raise r.fail(key, f"values must all be of one type, got {clip_repr(values)}")
        if len(set(values)) != len(values):
            raise r.fail(key, f"a value is listed twice in {clip_repr(values)}")
        points *= len(values)
    if points > MAX_POINTS:
        raise r.fail(where, f"{points:,} points before constraints; at most {MAX_POINTS:,}")
    return data


def _is_value(v: Any) -> bool:
    return isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v))


def check_parameter_name(r: Reader, key: str, name: Any) -> None:
    """A parameter's name: what a constraint can name and the kernel takes as a keyword."""
    if not isinstance(name, str) or not name.isidentifier():
        raise r.fail(key, "a parameter name must be a Python identifier")
    if keyword.iskeyword(name):
        raise r.fail(key, "a Python keyword cannot be a parameter name")
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        # Python's parser normalises identifiers, so no constraint could name it.
        raise r.fail(key, f"Python reads this name as {clip_repr(normal)}; write that")
    refuse_column_clash(r, key, name, "the parameter")


def read_configs(r: Reader, value: Any,
                 where: str = "configs") -> tuple[tuple[dict[str, Any], ...],
                                                  dict[str, list[Any]]]:
    """An explicit list of configs as triton.autotune takes them (each a mapping of its
    constexprs and launch options), and the values each parameter takes over them (in
    order of first appearance), which constraints and fixed: are checked against."""
    if not isinstance(value, list) or not value:
        raise r.fail(where, "expected a non-empty list of configs (each a mapping of "
                            f"parameter to value), got {clip_repr(value)}")
    kinds: dict[str, type] = {}
    first_of: dict[str, int] = {}
    for i, config in enumerate(value):
        key = f"{where}[{i}]"
        if not isinstance(config, dict) or not config:
            raise r.fail(key, "expected a mapping of parameter to value (e.g. {BLOCK: 64, "
                              f"num_warps: 4}}), got {clip_repr(config)}")
        for name, v in config.items():
            check_parameter_name(r, f"{key}.{name}", name)
            if not _is_value(v):
                raise r.fail(f"{key}.{name}", "expected a number, a string or a boolean, "
                                              f"got {clip_repr(v)}")
            kind = value_kind([kinds.setdefault(name, _kind(v))(), v])
            first_of.setdefault(name, i)
            if kind is None:
                raise r.fail(f"{key}.{name}", f"expected {kinds[name].__name__} as "
                                              f"{where}[{first_of[name]}].{name} is, got "
                                              f"{clip_repr(v)}; a parameter's values share "
                                              "one type")
            kinds[name] = kind
    seen: dict[str, int] = {}
    for i, config in enumerate(value):
        form = canonical_json({k: kinds[k](v) for k, v in config.items()})
        if form in seen:
            raise r.fail(f"{where}[{i}]", f"the same config as {where}[{seen[form]}]")
        seen[form] = i
    values: dict[str, dict[str, Any]] = {name: {} for name in kinds}
    for config in value:
        for name, v in config.items():
            values[name].setdefault(canonical_json(kinds[name](v)), v)
    return tuple(value), {name: list(vs.values()) for name, vs in values.items()}


def read_fixed(r: Reader, value: Any, space: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The spec's fixed values: what the file alone decides; checked against the kernel's
    signature once it is imported (kernels.check_fixed)."""
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
        if not is_json_scalar(v):
            raise r.fail(key, "expected a string, an integer, a finite number or a boolean, "
                              f"got {clip_repr(v)}")
    return fixed


def read_constraints(r: Reader, value: Any, parameters: Mapping[str, type],
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

