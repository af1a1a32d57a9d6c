"""Capture: a listener on Triton's autotuner that records each call into a
`@triton.autotune` kernel whose (kernel, key) it has not seen, into a folder: capture.json
(+ blobs/) and spec.yaml, rewritten after each new call so that a program that dies keeps
what it made. The program's own results do not change; with no_tune (implied under the CPU
interpreter, where Triton cannot benchmark) each new key runs its kernel's first config.

Used as `with sweep.autotune.capture(DIR): ...`, or, for `sweep capture`, started in the
child program by the boot folder's sitecustomize (start_from_environment).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import math
import os
import shlex
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import sweep.autotune.hook as hook
import sweep.autotune.record as record
from storage.atomic import replace_atomically
from storage.capture import (
    BLOBS,
    DEFAULT_MAX_BYTES,
    FILE,
    Call,
    Capture,
    CaptureError,
    module_file_digest,
    module_root,
    read_capture,
    save_blob,
    write_capture,
)
from sweep_kernels import CAPTURE

SPEC = "spec.yaml"
LOCK = ".capture.lock"  # held by the one process of a program that captures
ENV_CAPTURE = "SWEEP_AUTOTUNE_CAPTURE"
ENV_NO_TUNE = "SWEEP_AUTOTUNE_NO_TUNE"
ENV_SAVE_FLOATS = "SWEEP_AUTOTUNE_SAVE_FLOATS"
ENV_MAX_BYTES = "SWEEP_AUTOTUNE_MAX_BYTES"
PREFIX = "sweep capture: "
MAX_NAME_CHARS = 100  # a spec's name (the spec's own rule, sweep/spec/model.py)


def say(line: str) -> None:
    """One line on the program's stderr (its stdout is the program's own)."""
    sys.stderr.write(PREFIX + line.replace("\n", "\\n") + "\n")
    sys.stderr.flush()


def interpreting() -> bool:
    """TRITON_INTERPRET=1: Triton's benchmarker finds no driver there and raises."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@dataclass
class _Pending:
    """A new call, as found before it ran."""

    kernel: str
    key: tuple[Any, ...]
    label: str
    passed: dict[str, Any]
    before: dict[str, Any]
    configs: tuple[Any, ...]


def _autotuning_knobs() -> Any:
    """Triton's autotuning knobs (None in a Triton without them)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    return getattr(knobs, "autotuning", None)


class Recorder:
    """The listener (hook.Listener): one Call per (kernel, key), written as it comes."""

    def __init__(self, directory: Path, *, no_tune: bool = False, save_floats: bool = False,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 program: tuple[str, ...] | None = None, exclusive: bool = False) -> None:
        """exclusive: every Python process of a program run by `sweep capture` has a
        recorder, and one at a time writes the folder: the first to call a kernel takes
        its lock for the rest of its life (the ranks of a distributed job would otherwise
        overwrite each other's capture.json; a launcher that calls no kernel never takes
        it); a later process takes up what the earlier ones captured."""
        self.directory = directory
        self.exclusive = exclusive
        self._held: int | None = None
        self.save_floats = save_floats
        self.max_bytes = max_bytes
        self.program = tuple(program if program is not None else sys.orig_argv)
        self.no_tune = no_tune
        if not no_tune and interpreting():
            say("TRITON_INTERPRET=1: Triton cannot benchmark under its interpreter, so each "
                "kernel runs its first config (as --no-tune)")
            self.no_tune = True
        self.calls: list[Call] = []
        self.skipped: list[str] = []
        self.exit_code: int | None = None
        self.saved_bytes = 0
        self._seen: set[tuple[str, tuple[Any, ...]]] = set()
        self._names: dict[int, tuple[Any, str | None]] = {}  # id(tuner): (tuner, its name)
        self._lock = threading.RLock()

    def _own(self) -> bool:
        """Whether this recorder may write the folder (see exclusive)."""
        if not self.exclusive or self._held is not None:
            return True
        self._held = _hold(self.directory)
        if self._held is None:
            return False
        if (self.directory / FILE).exists():  # an earlier process's calls, taken up
            self._go_on_from(self.directory)
        return True

    def _go_on_from(self, directory: Path) -> None:
        earlier = read_capture(directory)
        self.calls = list(earlier.calls)
        self.skipped = list(earlier.skipped)
        self._seen = {(c.kernel, tuple(c.key)) for c in earlier.calls}

    @property
    def capture(self) -> Capture:
        return Capture(program=self.program, calls=tuple(self.calls),
                       exit_code=self.exit_code, versions=_versions(),
                       skipped=tuple(self.skipped))

    def around(self, tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               proceed: hook.Proceed) -> Any:
        key = hook.tuning_key(tuner, args, kwargs)
        with self._lock:
            pending = self._guarded(lambda: self._begin(tuner, args, kwargs, key))
        with self._first_config_only(tuner, key) if self.no_tune else contextlib.nullcontext():
            result = proceed()
        if pending is not None:
            with self._lock:
                self._guarded(lambda: self._finish(pending, tuner))
        return result

    def _guarded(self, step: Any) -> Any:
        """A capture that cannot go on says so; the program's own call goes on regardless."""
        try:
            return step()
        except OSError as e:
            say(f"cannot write {self.directory} ({e.strerror or e}); a call not captured")
        except Exception as e:
            say(f"a call not captured ({type(e).__name__}: {e})")
        return None

    def _begin(self, tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               key: tuple[Any, ...]) -> _Pending | None:
        if not self._own():
            return None
        kernel = self._kernel(tuner)
        if kernel is None or (kernel, key) in self._seen:
            return None
        self._seen.add((kernel, key))
        passed = record.passed_arguments(tuner, args, kwargs)
        label = record.key_label(tuner, passed, key)
        try:
            record.check_values(passed, key)
            configs = record.configs_with_grids(tuner, args, kwargs)
        except record.NotCaptured as e:
            self._skip(f"{kernel} ({label}): {e}; not captured")
            return None
        return _Pending(kernel, key, label, passed, record.snapshot(passed), configs)

    def _kernel(self, tuner: Any) -> str | None:
        """The tuner's "module:attr", found once; a tuner no module holds is said once."""
        known = self._names.get(id(tuner))
        if known is not None and known[0] is tuner:
            return known[1]
        name = hook.kernel_name(tuner)
        self._names[id(tuner)] = (tuner, name)
        if name is None:
            fn = hook.base_function(tuner)
            where = getattr(fn, "__module__", "?")
            why = ("it is defined in the program's own script (__main__); move it into a "
                   "module") if where == "__main__" else \
                "no attribute of its module holds its autotuner (made in a function?)"
            self._skip(f"{where}.{getattr(fn, '__qualname__', '?')}: {why}: a worker could "
                       "not import it; not captured")
        return name

    def _skip(self, line: str) -> None:
        say(line)
        self.skipped.append(line)
        self._write()

    def _finish(self, pending: _Pending, tuner: Any) -> None:
        outputs = record.changed(pending.passed, pending.before)
        whole = {name: record.tensor_bytes(t) for name, t in pending.before.items()
                 if record.saved_whole(t, self.save_floats)}
        size = sum(len(data) for data in whole.values())
        if self.saved_bytes + size > self.max_bytes:
            self._skip(f"{pending.kernel} ({pending.label}): its saved tensors would pass "
                       f"the {self.max_bytes}-byte limit (--max-bytes); not captured")
            return
        blobs = {name: save_blob(self.directory, data) for name, data in whole.items()}
        self.saved_bytes += size
        zeroed = tuple(getattr(tuner, "reset_to_zero", ()) or ())
        self.calls.append(Call(
            kernel=pending.kernel,
            source=module_file_digest(pending.kernel.partition(":")[0]),
            key_names=tuple(tuner.keys), key=pending.key,
            label=self._unique(pending.kernel, pending.label), configs=pending.configs,
            args=record.arguments(pending.passed, pending.before, blobs, zeroed),
            outputs=outputs, reset_to_zero=zeroed,
            restore_value=tuple(getattr(tuner, "restore_value", ()) or ()),
            hooks=bool(getattr(tuner, "user_defined_pre_hook", False) or
                       getattr(tuner, "user_defined_post_hook", False)),
            device=record.device_of(pending.before),
            root=module_root(pending.kernel.partition(":")[0])))
        self._write()

    def _unique(self, kernel: str, label: str) -> str:
        """A second key of one kernel with the same label gets " #2", and so on."""
        taken = {c.label for c in self.calls if c.kernel == kernel}
        n, unique = 1, label
        while unique in taken:
            n += 1
            unique = f"{label} #{n}"
        return unique

    @contextlib.contextmanager
    def _first_config_only(self, tuner: Any, key: tuple[Any, ...]) -> Iterator[None]:
        """A key Triton would tune: its benchmark answers at once, the first config best,
        and nothing goes to Triton's disk cache. do_bench is a cached_property (triton 3.6
        to 3.9), so the instance's dict overrides it; both are put back after."""
        if key in tuner.cache or len(tuner.configs) <= 1:
            yield
            return
        own = tuner.__dict__
        had, previous = "do_bench" in own, own.get("do_bench")
        answered = [0]

        def first_only(kernel_call: Any, quantiles: Any = None, **_: Any) -> list[float]:
            answered[0] += 1
            return [0.0] * 3 if answered[0] == 1 else [math.inf] * 3

        cache_results = tuner.cache_results
        own["do_bench"], tuner.cache_results = first_only, False
        # Nor does Triton say it tuned (TRITON_PRINT_AUTOTUNING): it did not.
        knobs = _autotuning_knobs()
        printing = getattr(knobs, "print", None)
        if printing:
            knobs.print = False
        try:
            yield
        finally:
            own.pop("do_bench", None)
            if had:
                own["do_bench"] = previous
            tuner.cache_results = cache_results
            if printing:
                knobs.print = printing

    def _write(self) -> None:
        capture = self.capture
        write_capture(self.directory, capture)
        if capture.calls:
            write_spec(self.directory, capture)

    def close(self, exit_code: int | None) -> None:
        """The capture's final state (exit_code None: not known here, as at interpreter
        exit; `sweep capture` writes the program's)."""
        with self._lock:
            self.exit_code = exit_code
            if self._guarded(self._own):
                self._guarded(self._write)


def _versions() -> dict[str, str]:
    out = {}
    for name in ("triton", "torch"):
        module = sys.modules.get(name)
        if module is not None and isinstance(getattr(module, "__version__", None), str):
            out[name] = str(module.__version__)
    return out


def spec_name(program: tuple[str, ...]) -> str:
    """"capture-" + the program's script stem (the module of `-m`, else the command)."""
    stem = ""
    for i, word in enumerate(program):
        if word == "-m" and i + 1 < len(program):
            stem = program[i + 1].rpartition(".")[2]
            break
        if word.endswith(".py"):
            stem = Path(word).stem
            break
    stem = stem or (Path(program[0]).name if program else "program")
    name = "capture-" + "".join(c if c.isprintable() and c not in "/\\" else "_" for c in stem)
    return name[:MAX_NAME_CHARS]


def spec_text(directory: Path, capture: Capture) -> str:
    """DIR/spec.yaml (CONTRACT.md): every captured (kernel, key) a problem, its configs the
    kernel's own list."""
    import yaml

    bf16 = any(a.tensor is not None and a.tensor.dtype == "bfloat16" and a.name in c.outputs
               for c in capture.calls for a in c.args)
    tolerance = 0.02 if bf16 else 0.01
    doc = {"name": spec_name(capture.program), "kernel": f"{CAPTURE}{FILE}",
           "validation": {"rtol": tolerance, "atol": tolerance},
           "problems": [{"kernel": c.kernel, "key": c.label,
                         "configs": [config.as_spec() for config in c.configs]}
                        for c in capture.calls]}
    program = shlex.join(capture.program).replace("\n", "\\n").replace("\r", "\\r")
    spec = shlex.quote(str(directory / SPEC))
    return (f"# Written by `sweep capture` for: {program}\n"
            "# Every call into an autotuned kernel with a key not seen before is a problem; "
            "a problem's\n# configs are its kernel's own list. Tune them all: "
            f"sweep run {spec} --out RUN\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100,
                             allow_unicode=True))


def write_spec(directory: Path, capture: Capture) -> None:
    text = spec_text(directory, capture)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    replace_atomically(directory / SPEC, write)


def folder_holds(directory: Path) -> tuple[str, list[str]]:
    """What an --out folder holds: "new" (absent), "empty", "capture" (an earlier one:
    capture.json and nothing but a capture's files), or "other" with its entries."""
    if not directory.exists():
        return "new", []
    if not directory.is_dir():
        return "other", [directory.name]
    names = sorted(p.name for p in directory.iterdir())
    if not names:
        return "empty", []
    if FILE in names and set(names) <= {FILE, SPEC, BLOBS, LOCK}:
        return "capture", names
    return "other", names


@contextlib.contextmanager
def capture(out_dir: str | os.PathLike[str], *, no_tune: bool = False,
            save_floats: bool = False, max_bytes: int = DEFAULT_MAX_BYTES,
            force: bool = False) -> Iterator[Recorder]:
    """Capture the calls into autotuned kernels made inside the block, into out_dir (new,
    empty, or with force an earlier capture, which is replaced). Anything else there is
    refused (ValueError), nothing in it touched."""
    directory = Path(out_dir)
    held, names = folder_holds(directory)
    if held == "other":
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3
                                        else "")
        raise ValueError(f"{directory}: not empty and not a capture (it holds {shown}); "
                         "capture into a new or empty folder")
    if held == "capture" and not force:
        raise ValueError(f"{directory}: holds an earlier capture; capture into a new folder, "
                         "or pass force=True to replace it")
    if held == "capture":  # replaced: what it held would mix with this one's
        for name in (SPEC, FILE):
            (directory / name).unlink(missing_ok=True)
        for blob in (directory / BLOBS).glob("*"):
            blob.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(directory, no_tune=no_tune, save_floats=save_floats,
                        max_bytes=max_bytes)
    hook.install(recorder)
    code = 0
    try:
        yield recorder
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    except BaseException:
        code = 1
        raise
    finally:
        hook.uninstall(recorder)
        recorder.close(code)


def start_from_environment() -> Recorder | None:
    """Capture this whole process into $SWEEP_AUTOTUNE_CAPTURE (the boot folder's
    sitecustomize calls this); the last capture.json is written at exit."""
    directory = os.environ.get(ENV_CAPTURE, "")
    if not directory:
        return None
    text = os.environ.get(ENV_MAX_BYTES, "") or str(DEFAULT_MAX_BYTES)
    if not text.isdigit():
        say(f"{ENV_MAX_BYTES}: expected a whole number of bytes, got {text!r}; "
            "nothing captured")
        return None
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        recorder = Recorder(Path(directory), no_tune=_flag(ENV_NO_TUNE),
                            save_floats=_flag(ENV_SAVE_FLOATS), max_bytes=int(text),
                            exclusive=True)
        hook.install(recorder)  # imports triton
    except (ImportError, OSError, CaptureError) as e:
        say(f"cannot capture in this program ({type(e).__name__}: {e}); it runs without")
        return None
    atexit.register(recorder.close, None)
    return recorder


def _hold(directory: Path) -> int | None:
    """The folder's capture lock, taken without waiting (None: another process has it)."""
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def finish(directory: Path, program: tuple[str, ...], exit_code: int) -> Capture | None:
    """`sweep capture`'s last word on the capture its child wrote: the program as the user
    gave it and its exit code (None: the program captured nothing, not even an empty
    capture.json: it never reached its first import of the capture)."""
    if not (directory / FILE).exists():
        return None
    done = replace(read_capture(directory), program=program, exit_code=exit_code)
    write_capture(directory, done)
    if done.calls:
        write_spec(directory, done)
    return done


class _CallableModule(types.ModuleType):
    """Importing this module sets it as sweep.autotune's attribute `capture`, over the
    function of that name the package defines: calling it still opens the capture."""

    def __call__(self, out_dir: str | os.PathLike[str], **options: Any) -> Any:
        return capture(out_dir, **options)


sys.modules[__name__].__class__ = _CallableModule
