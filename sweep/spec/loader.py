"""The order in which a spec is read: everything the file alone decides first, the kernel it
names last, so the file's own mistakes are reported before any of its code runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweep.spec.constraints import Constraint
from sweep.spec.kernels import KernelFacts, Spaces, kernel_facts
from sweep.spec.model import (
    KERNEL_FREE,
    MAX_NAME_CHARS,
    OwnSpace,
    ReplayOptions,
    Spec,
    SpecError,
)
from sweep.spec.replay_table import read_replay_table
from sweep.spec.rules import Reader
from sweep.spec.sections import (
    read_configs,
    read_constraints,
    read_fixed,
    read_kernel,
    read_name,
    read_own_spaces,
    read_problem,
    read_problems,
    read_run,
    read_search,
    read_simulate,
    read_space,
    read_timing,
    read_validation,
)
from sweep.spec.space import parameter_kinds, union_space
from sweep.spec.yaml_loader import parse_yaml, read_text


def _constraints_of(r: Reader, value: Any, space: Mapping[str, list[Any]],
                    problem: dict[str, Any], fixed: dict[str, Any],
                    i: int) -> tuple[Constraint, ...]:
    """The constraints read against problems[i]; a mistake names that problem too."""
    try:
        return read_constraints(r, value, parameter_kinds(space), problem, fixed)
    except SpecError as e:
        raise SpecError(f"{e} (with problems[{i}])") from None


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
    r = Reader(path, cwd / path if cwd is not None else path)
    if text is None:
        text = read_text(path, r.source)
    doc = r.document(parse_yaml(path, text))
    # Each step raises at its first mistake, so this order decides which of several
    # mistakes a file is refused for: keep it.
    # A long file name is no mistake in the spec: only its start names the run.
    name = read_name(r, doc.get("name", path.stem[:MAX_NAME_CHARS]))
    kernel_name = read_kernel(r, doc["kernel"])
    timing = read_timing(r, doc.get("timing"))
    validation = read_validation(r, doc.get("validation", {}))
    run = read_run(r, doc.get("run"), backend)
    simulate = read_simulate(r, doc.get("simulate"))
    search = read_search(r, doc.get("search"))
    configs, space = _read_top_space(r, doc)
    problem_as_written = read_problem(r, doc.get("problem"))
    entries, own = read_own_spaces(r, doc.get("problems"))
    space = _spaces_used(r, doc, space, own)
    # A problem tunes its own space or the spec's: every name either is, fixed: none.
    spaces = [o.space if o else space for o in own] or \
        [space] * (len(entries) if isinstance(entries, list) else 0)
    fixed_as_written = read_fixed(r, doc.get("fixed"), union_space([space, *spaces]))
    problems_as_written = read_problems(r, entries, problem_as_written, spaces,
                                        fixed_as_written)
    if problems_as_written and run.backend == "replay":
        raise r.fail("problems", "the replay backend plays back one problem's table; "
                                 "write problem: alone")
    # Read against each problem: a constraint may name a problem value that differs.
    each_constraints = tuple(
        _constraints_of(r, doc.get("constraints"), spaces[i], p, fixed_as_written, i)
        for i, p in enumerate(problems_as_written))
    constraints = each_constraints[0] if each_constraints else read_constraints(
        r, doc.get("constraints"), parameter_kinds(space), problem_as_written,
        fixed_as_written)
    # Checked whatever the backend, as simulate is; the table is read only to replay it.
    written_replay = r.section(ReplayOptions, doc.get("replay"), "replay")
    replay, replay_source = written_replay, ""
    if run.backend == "replay":
        replay, replay_source = read_replay_table(r, written_replay)
    facts = KernelFacts(problem=dict(problem_as_written), fixed=dict(fixed_as_written),
                        problems=problems_as_written)
    if run.backend not in KERNEL_FREE and import_kernel:
        tuned = Spaces(space, [("configs" if o.configs else "space", o.space) if o else None
                               for o in own], "configs" if configs else "space")
        facts = kernel_facts(r, kernel_name, problem_as_written, fixed_as_written, tuned,
                             run.backend, problems_as_written)
    return Spec(path=path, text=text, name=name, kernel=kernel_name, problem=facts.problem,
                problem_as_written=problem_as_written, space=space, constraints=constraints,
                timing=timing, validation=validation, run=run, simulate=simulate,
                kernel_source=facts.source, fixed=facts.fixed,
                fixed_as_written=fixed_as_written,
                # A relative table path would not survive the copy into the run directory.
                overridden=backend is not None or replay.table != written_replay.table
                or kernel_name != doc["kernel"],
                replay=replay, replay_source=replay_source, work=facts.work, search=search,
                kernel_files=facts.files, problem_entries=tuple(entries or ()),
                problems=facts.problems, problem_constraints=each_constraints,
                problem_work=facts.problem_work, configs=configs, problem_spaces=own)


def _read_top_space(r: Reader, doc: dict[str, Any]) -> tuple[tuple[dict[str, Any], ...],
                                                              dict[str, list[Any]] | None]:
    """The spec's own `configs:` (and the values each parameter takes over them) or
    `space:`; None where it has neither."""
    if "configs" in doc:
        return read_configs(r, doc["configs"])
    if "space" in doc:
        return (), read_space(r, doc["space"])
    return (), None


def _spaces_used(r: Reader, doc: dict[str, Any], space: dict[str, list[Any]] | None,
                 own: tuple[OwnSpace | None, ...]) -> dict[str, list[Any]]:
    """The spec's space, which some problem tunes, or (every problem tuning its own) all
    of theirs together."""
    key = "configs" if "configs" in doc else "space"
    if own and all(own):
        if space is not None:
            raise r.fail(key, "no problem tunes it: every problem has a space: or configs: "
                              "of its own; drop it")
        return union_space([o.space for o in own if o])
    if space is None:
        raise r.fail("space", "required key is missing (or configs:, or a space: or "
                              "configs: in every problem)")
    return space
