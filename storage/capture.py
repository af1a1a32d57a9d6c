"""A capture: the calls a program made into its `@triton.autotune` kernels, as `sweep
capture` records them (capture.json, and blobs/ for the tensors saved whole).

One record per (kernel, tuning key) the program called: where the kernel lives, its configs
as written with the grid each launches, Triton's own tuning key, and the call's arguments:
integer and boolean tensors saved as they were (indices, offsets, masks), floating-point ones
by shape, dtype and strides (re-made from a seed when tuned), scalars as values. Read back
like every file a run holds: checked field by field, one line when it is not as written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from storage.atomic import replace_atomically, write_bytes_atomically
from storage.readback import ReadBackError, read_json, read_small

FORMAT = 1
FILE = "capture.json"
BLOBS = "blobs"
LIMIT = 256 * 2**20  # capture.json itself: metadata, never tensors
# Saved tensors (integer ones always, floating ones with --save-floats), over the capture.
DEFAULT_MAX_BYTES = 2**30
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument. blob: the SHA-256 of its bytes under blobs/ ("" when it is re-made
    from the seed: then only its geometry is kept). storage: elements of the storage it views
    from its offset on (enough for its strides)."""

    dtype: str  # torch's name without "torch.": "float32", "int64", "bool"
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage: int
    blob: str = ""
    zero: bool = False  # reset_to_zero: the kernel expects it zeroed before each launch


@dataclass(frozen=True)
class Arg:
    """One argument of the call, by name: a tensor, or a JSON scalar (None included)."""

    name: str
    tensor: TensorArg | None = None
    value: Any = None


@dataclass(frozen=True)
class CapturedConfig:
    """One config of the kernel's list, as written, and the grid it launches for this call
    (a grid function evaluated for it at capture)."""

    kwargs: Mapping[str, Any]
    num_warps: int
    num_stages: int
    num_ctas: int = 1
    maxnreg: int | None = None
    pre_hook: bool = False
    grid: tuple[int, ...] = (1,)

    def as_spec(self) -> dict[str, Any]:
        """The config as a spec's `configs:` entry (and a trial's config): kwargs and the
        launch options, maxnreg only where set."""
        out = {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages,
               "num_ctas": self.num_ctas}
        if self.maxnreg is not None:
            out["maxnreg"] = self.maxnreg
        return out


@dataclass(frozen=True)
class Call:
    """One (kernel, key) the program called.

    kernel: "module:attr" where the Autotuner object lives (what a worker imports).
    source: SHA-256 of that module's file at capture.
    key: Triton's tuning key for the call, exactly (key values, then the dtype strings).
    label: the key as a problem names it ("N=4096; float32"): unique per kernel.
    outputs: the tensor arguments one launch changed, in argument order: what a config's
    launch is validated on.
    hooks: the autotuner has a pre_hook or post_hook of the user's own.
    """

    kernel: str
    source: str
    key_names: tuple[str, ...]
    key: tuple[Any, ...]
    label: str
    configs: tuple[CapturedConfig, ...]
    args: tuple[Arg, ...]
    outputs: tuple[str, ...]
    reset_to_zero: tuple[str, ...] = ()
    restore_value: tuple[str, ...] = ()
    hooks: bool = False
    device: str = "cpu"  # "cuda" or "cpu", where the program's tensors were
    # The folder the kernel's module was imported from (its top package's parent): put on
    # a worker's sys.path, where the program's own path (its script's folder) is not.
    root: str = ""


@dataclass(frozen=True)
class Capture:
    program: tuple[str, ...]
    calls: tuple[Call, ...]
    exit_code: int | None = None  # None while the program runs (or when it was killed)
    versions: Mapping[str, str] = field(default_factory=dict)  # triton, torch at capture
    skipped: tuple[str, ...] = ()  # one line per call not captured, and why

    def call(self, kernel: str, label: str) -> Call | None:
        for c in self.calls:
            if c.kernel == kernel and c.label == label:
                return c
        return None


class CaptureError(ReadBackError):
    """capture.json (or a blob) is not as `sweep capture` wrote it."""


def blob_path(directory: Path, digest: str) -> Path:
    return directory / BLOBS / f"{digest}.bin"


def save_blob(directory: Path, data: bytes) -> str:
    """Write bytes once under their digest (durable before capture.json names them)."""
    digest = hashlib.sha256(data).hexdigest()
    path = blob_path(directory, digest)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(path, data)
    return digest


def read_blob(directory: Path, digest: str, size: int) -> bytes:
    """A blob's bytes, checked against its digest and the size its tensor needs."""
    path = blob_path(directory, digest)
    try:
        data = read_small(path, limit=max(size, 1))
    except FileNotFoundError:
        raise CaptureError(path, "missing (capture.json names it)") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise CaptureError(path, "does not hold the bytes capture.json names")
    return data


def write_capture(directory: Path, capture: Capture) -> None:
    """capture.json, replaced atomically: a program killed mid-run leaves the calls so far."""
    doc = {"format": FORMAT, **asdict(capture)}
    text = json.dumps(doc, indent=1, allow_nan=False)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    replace_atomically(directory / FILE, write)


def read_capture(directory: Path) -> Capture:
    """The capture in directory (a folder holding capture.json, or the file's own path)."""
    path = directory if directory.name == FILE and not directory.is_dir() else directory / FILE
    try:
        doc = read_json(path, LIMIT)
    except FileNotFoundError:
        raise CaptureError(path, "not found: expected a folder written by `sweep capture`") \
            from None
    except ReadBackError as e:  # not JSON, not a regular file, too large
        raise CaptureError(path, e.why) from None
    return _Checker(path).capture(doc)


class _Checker:
    """capture.json's fields, each checked for its type: a hand edit is one line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, expected: str) -> CaptureError:
        return CaptureError(self.path, f"{where}: expected {expected}")

    def mapping(self, value: Any, where: str, keys: Sequence[str] = ()) -> dict[str, Any]:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.fail(where, "a mapping")
        for k in keys:
            if k not in value:
                raise self.fail(f"{where}.{k}", "a value (it is missing)")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, "a string")
        return value

    def integer(self, value: Any, where: str, low: int = 0) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise self.fail(where, f"an integer >= {low}")
        return value

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(where, "a list of strings")
        return tuple(self.text(v, f"{where}[{i}]") for i, v in enumerate(value))

    def scalar(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, str)) or \
                (isinstance(value, float) and value == value and abs(value) != float("inf")):
            return value
        raise self.fail(where, "a JSON scalar")

    def capture(self, doc: Any) -> Capture:
        doc = self.mapping(doc, "capture", ("format", "program", "calls"))
        if doc["format"] != FORMAT:
            raise self.fail("format", f"{FORMAT} (written by another version of sweep?)")
        calls = doc["calls"]
        if not isinstance(calls, list):
            raise self.fail("calls", "a list")
        exit_code = doc.get("exit_code")
        if exit_code is not None and (not isinstance(exit_code, int) or
                                      isinstance(exit_code, bool)):
            raise self.fail("exit_code", "an integer or null")
        versions = self.mapping(doc.get("versions", {}), "versions")
        checked = tuple(self.call(c, f"calls[{i}]") for i, c in enumerate(calls))
        seen: set[tuple[str, str]] = set()
        for i, c in enumerate(checked):
            if (c.kernel, c.label) in seen:
                raise self.fail(f"calls[{i}].label", "a label no other call of its kernel has")
            seen.add((c.kernel, c.label))
        return Capture(program=self.strings(doc["program"], "program"), calls=checked,
                       exit_code=exit_code,
                       versions={k: self.text(v, f"versions.{k}") for k, v in versions.items()},
                       skipped=self.strings(doc.get("skipped", []), "skipped"))

    def call(self, value: Any, where: str) -> Call:
        c = self.mapping(value, where, ("kernel", "source", "key_names", "key", "label",
                                        "configs", "args", "outputs"))
        kernel = self.text(c["kernel"], f"{where}.kernel")
        module, sep, attr = kernel.partition(":")
        if not sep or not module or not attr.isidentifier():
            raise self.fail(f"{where}.kernel", "'module:attr'")
        if not isinstance(c["key"], list):
            raise self.fail(f"{where}.key", "a list of scalars")
        configs = c["configs"]
        if not isinstance(configs, list) or not configs:
            raise self.fail(f"{where}.configs", "a non-empty list")
        args = c["args"]
        if not isinstance(args, list):
            raise self.fail(f"{where}.args", "a list")
        checked_args = tuple(self.arg(a, f"{where}.args[{i}]") for i, a in enumerate(args))
        names = {a.name for a in checked_args}
        outputs = self.strings(c["outputs"], f"{where}.outputs")
        for i, name in enumerate(outputs):
            arg = next((a for a in checked_args if a.name == name), None)
            if arg is None or arg.tensor is None:
                raise self.fail(f"{where}.outputs[{i}]", "the name of a tensor argument")
        for group in ("reset_to_zero", "restore_value"):
            for i, name in enumerate(self.strings(c.get(group, []), f"{where}.{group}")):
                if name not in names:
                    raise self.fail(f"{where}.{group}[{i}]", "the name of an argument")
        device = self.text(c.get("device", "cpu"), f"{where}.device")
        if device not in ("cpu", "cuda"):
            raise self.fail(f"{where}.device", "cpu or cuda")
        if not isinstance(c.get("hooks", False), bool):
            raise self.fail(f"{where}.hooks", "true or false")
        return Call(kernel=kernel, source=self.text(c["source"], f"{where}.source"),
                    key_names=self.strings(c["key_names"], f"{where}.key_names"),
                    key=tuple(self.scalar(v, f"{where}.key[{i}]")
                              for i, v in enumerate(c["key"])),
                    label=self.text(c["label"], f"{where}.label"),
                    configs=tuple(self.config(x, f"{where}.configs[{i}]")
                                  for i, x in enumerate(configs)),
                    args=checked_args, outputs=outputs,
                    reset_to_zero=self.strings(c.get("reset_to_zero", []),
                                               f"{where}.reset_to_zero"),
                    restore_value=self.strings(c.get("restore_value", []),
                                               f"{where}.restore_value"),
                    hooks=c.get("hooks", False), device=device,
                    root=self.text(c.get("root", ""), f"{where}.root"))

    def config(self, value: Any, where: str) -> CapturedConfig:
        c = self.mapping(value, where, ("kwargs", "num_warps", "num_stages", "grid"))
        kwargs = self.mapping(c["kwargs"], f"{where}.kwargs")
        for k, v in kwargs.items():
            if k in LAUNCH_OPTIONS or not k.isidentifier():
                raise self.fail(f"{where}.kwargs.{k}", "a constexpr's name")
            self.scalar(v, f"{where}.kwargs.{k}")
        grid = c["grid"]
        if not isinstance(grid, list) or not 1 <= len(grid) <= 3:
            raise self.fail(f"{where}.grid", "a list of 1 to 3 integers")
        maxnreg = c.get("maxnreg")
        if not isinstance(c.get("pre_hook", False), bool):
            raise self.fail(f"{where}.pre_hook", "true or false")
        return CapturedConfig(
            kwargs=dict(kwargs), num_warps=self.integer(c["num_warps"], f"{where}.num_warps", 1),
            num_stages=self.integer(c["num_stages"], f"{where}.num_stages"),
            num_ctas=self.integer(c.get("num_ctas", 1), f"{where}.num_ctas", 1),
            maxnreg=None if maxnreg is None else self.integer(maxnreg, f"{where}.maxnreg", 1),
            pre_hook=c.get("pre_hook", False),
            grid=tuple(self.integer(g, f"{where}.grid[{i}]") for i, g in enumerate(grid)))

    def arg(self, value: Any, where: str) -> Arg:
        a = self.mapping(value, where, ("name",))
        name = self.text(a["name"], f"{where}.name")
        if not name.isidentifier():
            raise self.fail(f"{where}.name", "an argument's name")
        if a.get("tensor") is None:
            return Arg(name, value=self.scalar(a.get("value"), f"{where}.value"))
        t = self.mapping(a["tensor"], f"{where}.tensor", ("dtype", "shape", "strides",
                                                          "storage"))
        shape, strides = t["shape"], t["strides"]
        if not isinstance(shape, list) or not isinstance(strides, list) or \
                len(shape) != len(strides):
            raise self.fail(f"{where}.tensor", "shape and strides, lists of one length")
        tensor = TensorArg(
            dtype=self.text(t["dtype"], f"{where}.tensor.dtype"),
            shape=tuple(self.integer(s, f"{where}.tensor.shape[{i}]")
                        for i, s in enumerate(shape)),
            strides=tuple(self.integer(s, f"{where}.tensor.strides[{i}]")
                          for i, s in enumerate(strides)),
            storage=self.integer(t["storage"], f"{where}.tensor.storage"),
            blob=self.text(t.get("blob", ""), f"{where}.tensor.blob"),
            zero=bool(t.get("zero", False)))
        needed = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.strides)) \
            if all(tensor.shape) else 0
        if tensor.storage < needed:
            raise self.fail(f"{where}.tensor.storage", f"at least {needed} elements for its "
                                                       "shape and strides")
        if tensor.blob and (len(tensor.blob) != 64 or
                            any(ch not in "0123456789abcdef" for ch in tensor.blob)):
            raise self.fail(f"{where}.tensor.blob", "a SHA-256 in hex")
        return Arg(name, tensor=tensor)


def config_form(values: Mapping[str, Any]) -> str:
    """A config (kwargs and launch options) as canonical text: what matches a tuned config
    to the live triton.Config of a kernel's list. num_ctas 1 and maxnreg None are Triton's
    defaults, so a config that leaves them out is the same config."""
    values = dict(values)
    values.setdefault("num_ctas", 1)
    if values.get("maxnreg") is None:
        values.pop("maxnreg", None)
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


def module_root(module_name: str) -> str:
    """The folder a module is imported from: its file's folder, up one per package level."""
    import sys

    path = getattr(sys.modules.get(module_name), "__file__", None)
    if not path:
        return ""
    folder = Path(path).resolve().parent
    if Path(path).name == "__init__.py":
        folder = folder.parent
    for _ in range(module_name.count(".")):
        folder = folder.parent
    return str(folder)


def module_file_digest(module_name: str) -> str:
    """SHA-256 of a module's file as imported now ("" where it has none)."""
    import sys

    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path or not os.path.exists(path):
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
