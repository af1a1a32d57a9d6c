"""A run's tuned configs, loaded back into the unchanged program that was captured:
`use(RUN)` fills each captured kernel's autotuner with its tuned config per key before the
kernel's first call, so the program launches tuned configs without tuning.

A key the run did not tune falls back to Triton's own autotune, or, with nearest=True, to
the config of the nearest tuned key of that kernel (the best-config cache's distance
rule, storage/cache.py). Every process that loads the same run runs the same configs.
"""

from __future__ import annotations

import os
import sys
import types
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from storage.best_file import BestFile, Choice
from storage.cache import distance, sizes_apart
from storage.capture import CaptureError, read_capture
from sweep import EXIT_BAD_INPUT
from sweep.autotune.hook import (
    Proceed,
    config_form,
    install,
    kernel_name,
    tuning_key,
    uninstall,
)
from sweep.spec import SpecError
from sweep_kernels import CAPTURE

# What a Triton tuning key is and what a tuned config is, as the table holds them.
Key = tuple[Any, ...]
Config = Mapping[str, Any]


class UseError(SpecError):
    """The folder is no run of a capture, or a file of it cannot be read: one line, exit 2
    (the command's bad input)."""


@dataclass(frozen=True)
class Loaded:
    """What use() loaded. table: kernel ("module:attr") -> Triton's tuning key -> the
    tuned config (as the spec's config mapping); labels: the same keys as the problems
    name them ("N=1024; float32"). partial: the run had not finished."""

    run_dir: Path
    capture: Path
    table: Mapping[str, Mapping[Key, Config]]
    labels: Mapping[str, Mapping[Key, str]]
    nearest: bool = False
    partial: bool = False

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(self.table)

    @property
    def keys(self) -> int:
        return sum(len(keys) for keys in self.table.values())

    def __repr__(self) -> str:
        kernels = ", ".join(f"{k} ({len(v)} key{'s' * (len(v) != 1)})"
                            for k, v in self.table.items()) or "no tuned keys"
        how = (", nearest" if self.nearest else "") + (", partial run" if self.partial else "")
        return f"Loaded({str(self.run_dir)!r}: {kernels}{how})"


def load(run_dir: str | os.PathLike[str]) -> Loaded:
    """Read a run of a capture (its spec.yaml, the capture it names, its best.json) into
    the table use() installs; installs nothing (what `sweep exec` checks first)."""
    from sweep.best import run_best
    from sweep.run.rundir import RunDir

    path = Path(run_dir)
    if not path.is_dir():
        raise UseError(f"{path}: not a run directory (expected the --out of `sweep run` over "
                       "a capture's spec)" if path.exists() else
                       f"{path}: no such run directory")
    run = RunDir(path)
    found = run_best(path)  # run.json first: a folder that is no run is said so
    spec_doc = _spec_doc(run.spec)
    capture_file = _capture_of(run.spec, spec_doc)
    try:
        capture = read_capture(capture_file)
    except CaptureError as e:
        raise UseError(f"{e} (named by {run.spec})") from None
    table: dict[str, dict[Key, Config]] = {}
    labels: dict[str, dict[Key, str]] = {}
    for problem, choice in _problems(found, spec_doc):
        kernel, label = problem.get("kernel"), problem.get("key")
        config = _config_here(choice)
        if config is None:  # no config of this key succeeded: Triton's own autotune
            continue
        call = capture.call(kernel, label) if isinstance(kernel, str) and \
            isinstance(label, str) else None
        if call is None or not isinstance(kernel, str) or not isinstance(label, str):
            raise UseError(f"{run.best}: the problem {{kernel: {kernel!r}, key: {label!r}}} "
                           f"is no call of {capture_file} (captured again since the run?)")
        table.setdefault(kernel, {})[call.key] = dict(config)
        labels.setdefault(kernel, {})[call.key] = label
    return Loaded(run_dir=path, capture=capture_file, table=table, labels=labels,
                  partial=found.partial)


def use(run_dir: str | os.PathLike[str], *, nearest: bool = False) -> Loaded:
    """Load a run's tuned configs into this process's autotuned kernels (see the module's
    docstring): each is filled at its next call, so call it before the first. A second
    use() replaces the first."""
    global _current
    loaded = replace(load(run_dir), nearest=nearest)
    listener = _Filler(loaded.table, nearest)
    if _current is not None:
        uninstall(_current)
    install(listener)
    _current = listener
    return loaded


def use_from_environment() -> Loaded | None:
    """For the boot file (`sweep exec`, or the variables set by hand): SWEEP_AUTOTUNE_USE=
    RUN_DIR loads that run, SWEEP_AUTOTUNE_NEAREST=1 with nearest=True. It runs as Python
    starts, before the program: a run that cannot be loaded is one line on stderr and
    exit 2, the program not run (an exception there would only be printed, and the
    program run untuned)."""
    run_dir = os.environ.get("SWEEP_AUTOTUNE_USE")
    if not run_dir:
        return None
    try:
        return use(run_dir, nearest=os.environ.get("SWEEP_AUTOTUNE_NEAREST") == "1")
    except SpecError as e:
        sys.stderr.write(f"error: SWEEP_AUTOTUNE_USE: {e}\n")
        sys.stderr.flush()
        os._exit(EXIT_BAD_INPUT)


def _spec_doc(spec: Path) -> Any:
    from sweep.spec.yaml_loader import parse_yaml, read_spec_text

    return parse_yaml(spec, read_spec_text(spec))


def _capture_of(spec: Path, doc: Any) -> Path:
    """The capture.json the run's spec names (`kernel: capture:PATH`, relative to the
    spec where it is not absolute)."""
    kernel = doc.get("kernel") if isinstance(doc, dict) else None
    if not isinstance(kernel, str) or not kernel.startswith(CAPTURE) or \
            not kernel[len(CAPTURE):]:
        shown = kernel if isinstance(kernel, str) else type(kernel).__name__
        raise UseError(f"{spec}: kernel: expected {CAPTURE}PATH (a run of a capture's spec, "
                       f"written by `sweep capture`), got {shown[:80]!r}")
    return spec.parent / kernel[len(CAPTURE):]


def _problems(found: BestFile, spec: Any) -> list[tuple[dict[str, Any], Choice]]:
    """best.json's problems and their choices; a run of one problem has its best at the
    head only, and its problem is the one its spec names (`problem:`, or `problems:` of
    one)."""
    if found.by_problem:
        return [(p.problem, p.choice) for p in found.by_problem]
    if found.choice.best is None or not isinstance(spec, dict):
        return []
    entries = spec.get("problems")
    one = entries[0] if isinstance(entries, list) and len(entries) == 1 else spec.get("problem")
    if not isinstance(one, dict):
        return []
    return [({"kernel": one.get("kernel"), "key": one.get("key")}, found.choice)]


def _config_here(choice: Choice) -> Config | None:
    """A problem's best on this process's device type where the run timed more than one
    (and this one among them), else its best."""
    if len(choice.by_device) > 1:
        from sweep.tuned import _device

        here = choice.by_device.get(_device(None)[1])
        if here is not None:
            return here.config
    return choice.best.config if choice.best is not None else None


def nearest_key(key: Key, tuned: Mapping[Key, Any]) -> Key | None:
    """The tuned key nearest to key: of its length, alike in every entry but its sizes
    (the dtype strings), by storage/cache.py's distance over those sizes; ties go to the
    larger sizes, as sweep.tuned breaks them."""
    asked = _as_problem(key)
    near = [k for k in tuned if len(k) == len(key) and sizes_apart(asked, _as_problem(k))]
    if not near:
        return None
    return min(near, key=lambda k: (distance(asked, _as_problem(k)),
                                    [-b for a, b in zip(key, k) if a != b]))


def _as_problem(key: Key) -> dict[str, Any]:
    """A tuning key as the cache's distance takes a problem: its entries by place."""
    return {str(i): v for i, v in enumerate(key)}


class _Filler:
    """The hook's listener: on an autotuner's first call, its tuned keys go into its cache
    (Triton then tunes none of them); with nearest, a key neither cached nor tuned gets
    the nearest tuned key's config first."""

    def __init__(self, table: Mapping[str, Mapping[Key, Config]], nearest: bool) -> None:
        self.table, self.nearest = table, nearest
        # Each autotuner seen: its tuned keys' configs as its own list holds them.
        self.seen: weakref.WeakKeyDictionary[Any, dict[Key, Any]] = \
            weakref.WeakKeyDictionary()

    def around(self, tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               proceed: Proceed) -> Any:
        live = self.seen.get(tuner)
        if live is None:
            live = self.seen[tuner] = self._fill(tuner)
        if self.nearest and live:
            key = tuning_key(tuner, args, kwargs)
            if key not in tuner.cache:
                near = nearest_key(key, live)
                if near is not None:
                    tuner.cache[key] = live[near]
        return proceed()

    def _fill(self, tuner: Any) -> dict[Key, Any]:
        name = kernel_name(tuner)
        tuned = self.table.get(name) if name is not None else None
        if not tuned:
            return {}
        forms = {config_form(c): c for c in tuner.configs}
        # The kernel's own config where the tuned one is in its list (its pre_hook kept);
        # one the spec added (configs: edited, a space:) is made as triton.autotune would.
        live = {key: forms.get(config_form(config)) or _made(config)
                for key, config in tuned.items()}
        tuner.cache.update(live)
        return live


def _made(config: Config) -> Any:
    from triton import Config as TritonConfig

    options = ("num_warps", "num_stages", "num_ctas", "maxnreg")
    return TritonConfig({k: v for k, v in config.items() if k not in options},
                        **{k: config[k] for k in options if k in config})


_current: _Filler | None = None


class _CallableModule(types.ModuleType):
    """Once this module is imported, Python names it as the package's `use` (a package's
    attribute is set to its submodule), where `sweep.autotune.use(RUN)` means the function:
    called, the module is the function."""

    def __call__(self, run_dir: str | os.PathLike[str], *, nearest: bool = False) -> Loaded:
        return use(run_dir, nearest=nearest)


sys.modules[__name__].__class__ = _CallableModule
