"""`sweep best DIR --python PATH`: a run's bests as a Python module of their own, a
dispatch table that launch code imports where this project is not installed (it needs only
the standard library, and triton inside its triton_config) and that a diff can review.

Its lookup is the best-config cache's (storage/cache.py's distance, sweep/tuned.py's
nearest): the exact problem's config, else the nearest problem's that differs only in
sizes. The module's first line marks it as written here: only such a file is replaced.
"""

from __future__ import annotations

import pprint
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.atomic import write_bytes_atomically
from storage.readback import ReadBackError, printable, read_small

# The first line of every module written here: what tells one apart from a user's file.
HEADER = "# Written by `sweep best --python` (triton-sweep); running it again replaces " \
         "this file."
# A module this command wrote is tens of kilobytes; anything far larger is not one.
MODULE_LIMIT = 16 * 2**20


class DispatchError(ValueError):
    """The module cannot be written there: one line, naming the path."""


@dataclass(frozen=True)
class Tuned:
    """One problem of the table: its best (config None: no config succeeded for it)."""

    problem: Mapping[str, Any]
    config: Mapping[str, Any] | None
    device: str | None
    latency_ms: float | None
    index: int | None
    by_device: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Table:
    """What the module holds and says it came from."""

    kernel: str
    name: str
    run_dir: str
    fingerprint: str
    started_at: float | None  # the run's creation (run.json), seconds since 1970
    partial: bool
    problems: Sequence[Tuned]
    # The kernel's problem defaults the run merged in (keys no problem wrote): what a
    # caller may leave out, as tuned_config lets it.
    defaults: Mapping[str, Any]
    launch_options: Sequence[str]


def module_text(table: Table, now: float | None = None) -> str:
    """The module's source. Every value is written with repr (JSON's scalars, strings
    escaped), so nothing a run directory holds can become code."""
    tuned = [t for t in table.problems if t.config is not None]
    if not tuned:
        raise DispatchError(f"{table.run_dir}: no config succeeded: no table to write")
    devices = sorted({d for t in tuned for d in t.by_device} | {t.device for t in tuned
                                                                if t.device})
    keys = list(dict.fromkeys(k for t in table.problems for k in t.problem))
    several = len(devices) > 1
    rows = []
    for t in tuned:
        row: dict[str, Any] = {"problem": dict(t.problem), "config": dict(t.config or {}),
                               "device": t.device, "latency_ms": t.latency_ms,
                               "index": t.index}
        if several:  # else the one device's best is the row's own
            row["by_device"] = {d: dict(c) for d, c in sorted(t.by_device.items())}
        rows.append(row)
    constants = [
        ("KERNEL", table.kernel, "The kernel, as the spec names it."),
        ("DEVICE", devices[0] if not several else None,
         "The device every config was tuned on (None: several, see DEVICES)."),
        ("DEVICES", tuple(devices), None),
        ("RUN_DIR", table.run_dir, None), ("RUN_NAME", table.name, None),
        ("FINGERPRINT", table.fingerprint, None),
        ("PARTIAL", table.partial, "True: the run stopped before it finished (bests so far)."),
        ("KEYS", tuple(keys), "The problem keys, in the spec's order."),
        ("DEFAULTS", dict(table.defaults), "The kernel's defaults the run merged in: keys a "
                                           "problem may leave out."),
        ("LAUNCH_OPTIONS", tuple(table.launch_options),
         "Keys of a config that are triton.Config's keywords, not its kwargs."),
    ]
    lines = [HEADER, _docstring(table, tuned, devices, now), "",
             "from __future__ import annotations", "", "import math",
             "from collections.abc import Mapping", "from typing import Any", ""]
    for name, value, why in constants:
        typed = ": dict[str, Any]" if isinstance(value, dict) else ""
        lines += [f"# {why}"] * bool(why) + [f"{name}{typed} = {value!r}"]
    lines += ["# One row per tuned problem, in the spec's order: its best config (launch",
              "# options included, as the sweep ran them), where and how fast it ran.",
              *_listed("TABLE", rows),
              "# Problems no config succeeded for: answered from the nearest tuned one.",
              *_listed("UNTUNED", [dict(t.problem) for t in table.problems
                                   if t.config is None])]
    return "\n".join(lines) + "\n" + _CODE


def _listed(name: str, items: Sequence[dict[str, Any]]) -> list[str]:
    """A list constant, one item (or a few lines of it) at a time."""
    if not items:
        return [f"{name}: list[dict[str, Any]] = []"]
    return [f"{name}: list[dict[str, Any]] = [",
            *(textwrap.indent(pprint.pformat(item, width=88, sort_dicts=False), "    ") + ","
              for item in items), "]"]


def _docstring(table: Table, tuned: Sequence[Tuned], devices: Sequence[str],
               now: float | None) -> str:
    def stamp(t: float | None) -> str:
        return time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(t)) if t is not None else "?"

    def shown(problem: Mapping[str, Any]) -> str:
        return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                        for k, v in problem.items())

    text = [f"Tuned Triton configs of {table.kernel}: a dispatch table of "
            f"{len(tuned)} problem{'s' if len(tuned) != 1 else ''}.", "",
            f"From the sweep run {table.run_dir} ({table.name}, fingerprint "
            f"{table.fingerprint}, started {stamp(table.started_at)}), tuned on "
            f"{', '.join(devices)}; written by `sweep best --python` on "
            f"{stamp(now or time.time())}."]
    if table.partial:
        text += ["", "PARTIAL: the run stopped before it finished, so each config is the best "
                     "found so far; `sweep resume` the run, then write this module again."]
    untuned = [t for t in table.problems if t.config is None]
    if untuned:
        text += ["", "No config succeeded for: " + "; ".join(shown(t.problem) for t in untuned)
                 + " (each is answered from the nearest tuned problem)."]
    text += ["", "config_for(problem) gives the config tuned for a problem (a mapping of "
                 "KEYS; those left out take DEFAULTS), else the nearest tuned problem's, else "
                 "None; triton_config(problem) the same as a triton.Config. Only the standard "
                 "library is imported (triton by triton_config)."]
    body = "\n".join(wrapped for line in text
                     for wrapped in textwrap.wrap(printable(line, 10_000), 88,
                                                  break_on_hyphens=False,
                                                  break_long_words=False) or [""])
    return '"""' + body.replace("\\", "\\\\").replace('"', '\\"') + '\n"""'


_CODE = '''

def config_for(problem: Mapping[str, Any], device: str | None = None
               ) -> dict[str, Any] | None:
    """The config tuned for `problem` (its keys are KEYS; any left out take DEFAULTS), else
    the nearest tuned problem's: of those whose every value but the sizes (positive
    numbers) is alike, the one at the least sum, over the sizes that differ, of |log2| of
    their ratio (M = 16 is as near to 64 as 1024 to 4096), a tie going to the larger sizes.
    None where no tuned problem is alike (another dtype, say). device: a name of DEVICES,
    for that device type's best (None where it tuned nothing alike); by default each
    problem's fastest. The rule is triton-sweep's tuned_config's. A tuned problem is a
    dict lookup; another's answer is found once and remembered (see _ANSWERS)."""
    asked = {**DEFAULTS, **problem}
    if frozenset(asked) not in _KEY_SETS:
        raise ValueError(f"config_for: expected the problem keys {', '.join(KEYS)} (those "
                         f"of DEFAULTS may be left out), got {', '.join(map(str, problem))}")
    key = None
    if all(type(v) in _PLAIN for v in asked.values()) and type(device) in _PLAIN:
        key = (tuple(sorted(asked.items())), device)
    if key is not None and key in _ANSWERS:
        config = _ANSWERS[key]
    else:  # another value (a list, a tensor, a numpy int) is found each time, never kept
        config = _exact(asked, device) if key is not None else None
        if config is None:
            config = _nearest(asked, device)
        if key is not None:
            if len(_ANSWERS) >= MEMO_CAP:  # a bound: a run asking ever new sizes
                _ANSWERS.clear()
            _ANSWERS[key] = config
    return dict(config) if config is not None else None


def _config(row: Mapping[str, Any], device: str | None) -> Any:
    return row.get("by_device", {row["device"]: row["config"]}).get(device or row["device"])


def _exact(asked: Mapping[str, Any], device: str | None) -> Any:
    row = _ROWS.get(tuple(sorted(asked.items())))
    return _config(row, device) if row is not None else None


def _nearest(asked: Mapping[str, Any], device: str | None) -> Any:
    found = []
    for row in TABLE:
        tuned = row["problem"]
        config = _config(row, device)
        if config is not None and _alike(asked, tuned):
            # A difference of logs: the ratio of sizes far apart underflows.
            apart = sum(abs(math.log2(asked[k]) - math.log2(tuned[k])) for k in tuned
                        if asked[k] != tuned[k])
            larger = [-tuned[k] for k in sorted(tuned) if asked[k] != tuned[k]]
            found.append((apart, larger, config))
    if not found:
        return None
    return min(found, key=lambda f: (f[0], f[1]))[2]


# The tuned problems by their items, the key sets they use, and the answers given so far
# (by the problem asked and the device; at most MEMO_CAP, and only of problems whose every
# value is of the exact types in _PLAIN, which hash by value: a tensor, hashed by its
# identity, would be kept for ever): a launch's lookup is a dict's, not a scan.
_ROWS = {tuple(sorted(row["problem"].items())): row for row in TABLE}
_KEY_SETS = {frozenset(row["problem"]) for row in TABLE}
_PLAIN = (str, int, float, bool, type(None))
MEMO_CAP = 4096
_ANSWERS: dict[Any, Any] = {}


def triton_config(problem: Mapping[str, Any], device: str | None = None) -> Any:
    """config_for(problem, device) as a triton.Config (launch options as its keywords), or
    None."""
    config = config_for(problem, device)
    if config is None:
        return None
    import triton

    return triton.Config({k: v for k, v in config.items() if k not in LAUNCH_OPTIONS},
                         **{k: v for k, v in config.items() if k in LAUNCH_OPTIONS})


def _size(value: Any) -> bool:
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            0 < value < math.inf
    except OverflowError:  # an integer past a float's range
        return False


def _alike(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same keys, and every value equal but the sizes."""
    return set(a) == set(b) and all(a[k] == b[k] or (_size(a[k]) and _size(b[k]))
                                    for k in a)
'''


def write_module(path: Path, text: str) -> None:
    """Write the module at path: an existing file is replaced only if its first line is
    HEADER (a module written here before), and nothing is written otherwise."""
    if path.exists() or path.is_symlink():
        refused = f"{path}: exists and is not a module `sweep best --python` wrote"
        try:
            first = read_small(path, MODULE_LIMIT).split(b"\n", 1)[0]
        except (ReadBackError, OSError) as e:
            why = e.why if isinstance(e, ReadBackError) else e.strerror or e
            raise DispatchError(f"{refused} ({why}); nothing written") from None
        if first.decode(errors="replace") != HEADER:
            raise DispatchError(f"{refused} (its first line is not this command's); remove "
                                "it or choose another path; nothing written")
    try:
        write_bytes_atomically(path, text.encode())
    except OSError as e:
        raise DispatchError(f"{path}: cannot be written ({e.strerror or e})") from None
