"""Kernels a sweep can tune: the built-ins and the interface a user's kernel implements.

A kernel is a `Kernel` record: the Triton function, how to make inputs and the reference
result, the launch arguments and the grid for a config. A user's kernel plugs in as
"package.module:attr" naming such a record. Importing a kernel module decorates its Triton
functions, and Triton picks interpreter or compiler at that moment, so workers set
TRITON_INTERPRET before they import one (see actors/worker.py).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback

# The record's own module (a capture's record extends it); re-exported here, its home.
from sweep_kernels.record import CAPTURE as CAPTURE
from sweep_kernels.record import Config as Config
from sweep_kernels.record import Kernel as Kernel
from sweep_kernels.record import Problem as Problem

BUILTIN = {
    "matmul": "sweep_kernels.matmul:KERNEL",
    "softmax": "sweep_kernels.softmax:KERNEL",
    "faulty": "sweep_kernels.faulty:KERNEL",  # a copy whose MODE picks each failure, for tests
}
DTYPES = ("float16", "bfloat16", "float32")


class KernelError(ValueError):
    """The kernel name does not resolve to a Kernel."""




def capture_path(name: str) -> str | None:
    """PATH of a "capture:PATH" kernel name; None for any other name."""
    return name[len(CAPTURE):] if name.startswith(CAPTURE) else None


def reference_of(name: str) -> str:
    """'matmul' or 'pkg.mod:attr' -> 'module:attr', without importing anything; a capture
    -> 'sweep_kernels.captured:program'."""
    if name in BUILTIN:
        return BUILTIN[name]
    if capture_path(name) is not None:
        if not capture_path(name):
            raise KernelError("expected capture:PATH, the capture.json `sweep capture` wrote")
        return "sweep_kernels.captured:program"
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr.isidentifier():
        builtins = ", ".join(sorted(BUILTIN))
        raise KernelError(f"expected a built-in kernel ({builtins}) or 'package.module:attr'")
    return name


def load_kernel(name: str, search_path: str = "") -> Kernel:
    """search_path: a directory where a "module:attr" kernel may live, looked at after the
    installed packages (so a user's folder never shadows them)."""
    module_name, _, attr = reference_of(name).partition(":")
    if search_path and search_path not in sys.path:
        sys.path.append(search_path)
    path = capture_path(name)
    if path is not None:
        return _captured(path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name) and \
                module_name[len(e.name):][:1] in ("", "."):  # the module itself is not there
            raise KernelError(f"cannot import {module_name!r}: {e}") from None
        raise KernelError(_import_failed(module_name, e)) from None
    except Exception as e:  # the module's own code failed: its mistake, said in one line
        raise KernelError(_import_failed(module_name, e)) from None
    kernel = getattr(module, attr, None)
    if not isinstance(kernel, Kernel):
        records = ", ".join(sorted(k for k, v in vars(module).items() if isinstance(v, Kernel)))
        has = f"its Kernel records: {records}" if records else "it has no Kernel record"
        if not hasattr(module, attr):
            raise KernelError(f"module {module_name} has no attribute {attr!r} ({has})")
        raise KernelError(f"{module_name}:{attr} is a {type(kernel).__name__}, not a "
                          f"sweep_kernels.Kernel record ({has})")
    return kernel


def _captured_files(kernel: Kernel) -> dict[str, str]:
    from sweep_kernels.captured import source_files as captured_files

    return captured_files(kernel)


def _captured(path: str) -> Kernel:
    from storage.capture import CaptureError
    from sweep_kernels.captured import program

    try:
        return program(path)
    except CaptureError as e:
        raise KernelError(str(e)) from None


def _import_failed(module_name: str, e: BaseException) -> str:
    """"importing M failed: FILE:LINE: Type: message", FILE:LINE where the error is: a
    SyntaxError's own place, else the innermost frame of the user's code (importlib's
    and this module's frames are no one's concern)."""
    where = ""
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{_shown(e.filename)}:{e.lineno}: " if e.lineno else f"{_shown(e.filename)}: "
        message = e.msg
    else:
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not f.filename.startswith("<") and f.filename != __file__
                  and os.path.dirname(f.filename) != os.path.dirname(importlib.__file__)]
        home = _package_home(module_name)  # an error deep in torch: the user's line into it
        own = [f for f in frames if home and os.path.abspath(f.filename).startswith(home)]
        if own or frames:
            frame = (own or frames)[-1]
            where = f"{_shown(frame.filename)}:{frame.lineno}: "
        message = str(e)
    first = message.strip().splitlines()[0] if message.strip() else ""
    return f"importing {module_name} failed: {where}{type(e).__name__}" + \
        (f": {first}" if first else "")


def _package_home(module_name: str) -> str:
    """The file, or the package's folder, of the module's top-level package ("" unknown)."""
    origin = origin_of(module_name.partition(".")[0] + ":_")
    if origin is None:
        return ""
    return os.path.dirname(origin) + os.sep if os.path.basename(origin) == "__init__.py" \
        else origin


def _shown(path: str) -> str:
    """A path as the user would write it: relative to the current directory under it."""
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    except ValueError:  # another drive
        return path


def _source_modules(name: str, kernel: Kernel) -> list[str]:
    fn = getattr(kernel.fn, "fn", kernel.fn)  # JITFunction wraps the Python function
    return sorted({reference_of(name).partition(":")[0], fn.__module__})


def source_files(name: str, kernel: Kernel) -> dict[str, str]:
    """The files of every module loaded from the packages of the modules source_digest
    covers (the whole package: a kernel record's defaults may live in a module the named
    one imports), each with the SHA-256 of its bytes: what a cached answer checks, from
    files alone, to know that the kernel is the one it tuned without importing it (and
    torch). {} where a module has no file."""
    if capture_path(name) is not None:
        return _captured_files(kernel)
    tops = {m.partition(".")[0] for m in _source_modules(name, kernel)}
    out = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.partition(".")[0] not in tops:
            continue
        path = getattr(module, "__file__", None)
        if not path:
            if module_name in tops:
                return {}
            continue
        out[os.path.abspath(path)] = file_digest(path)
    return out


def origin_of(name: str, search_path: str = "") -> str | None:
    """The file the kernel's module would be imported from now (as load_kernel looks for
    it), without importing it (a package's parents are imported); None where it cannot
    be told."""
    if capture_path(name) is not None:
        return os.path.abspath(capture_path(name) or ".")
    module_name = reference_of(name).partition(":")[0]
    if search_path and search_path not in sys.path:
        sys.path.append(search_path)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    return os.path.abspath(spec.origin) if spec is not None and spec.origin else None


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes ("" where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def source_digest(name: str, kernel: Kernel) -> str:
    """SHA-256 over the source of the module named in the spec and the module defining the
    Triton function: an edit to either invalidates a resume."""
    if capture_path(name) is not None:
        return hashlib.sha256("".join(f"{p}\0{d}\0" for p, d in sorted(
            _captured_files(kernel).items())).encode()).hexdigest()
    modules = _source_modules(name, kernel)
    digest = hashlib.sha256()
    for module in modules:
        digest.update(inspect.getsource(sys.modules[module]).encode())
    return digest.hexdigest()
