"""One call into an autotuned kernel as a capture records it: its arguments (tensors by
geometry, integer and boolean ones saved whole), every config of the kernel's list with the
grid it would launch, the key as a problem names it, and the tensors one launch wrote.
What the listener around Autotuner.run (capture.py) hands over; it decides when.
"""

from __future__ import annotations

import inspect
import math
import sys
from typing import Any

import sweep.autotune.hook as hook
from storage.capture import Arg, CapturedConfig, TensorArg

NOT_ARGUMENTS = ("grid", "warmup")  # what Autotuner.__getitem__ passes beside the arguments


class NotCaptured(Exception):
    """Why a call cannot be recorded: said in one line, and the program goes on."""


def passed_arguments(tuner: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument of the call by name: positional ones by the kernel's argument names,
    then the keywords."""
    named = dict(zip(tuner.arg_names, args))
    named.update((k, v) for k, v in kwargs.items() if k not in NOT_ARGUMENTS)
    return named


def key_label(tuner: Any, passed: dict[str, Any], key: tuple[Any, ...]) -> str:
    """The key as a problem names it: "N=1024, D=64; float32/int64" (CONTRACT.md's rule:
    the key's values by name, then its distinct dtypes)."""
    names = [k for k in tuner.keys if k in passed and k in tuner.arg_names]
    values = ", ".join(f"{name}={value}" for name, value in zip(names, key))
    dtypes = "/".join(dict.fromkeys(str(d).removeprefix("torch.") for d in key[len(names):]))
    return "; ".join(part for part in (values, dtypes) if part) or "no key"


def json_scalar(value: Any) -> bool:
    """What capture.json holds as a value (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # no torch imported: no tensor can be passed
    return torch is not None and isinstance(value, torch.Tensor)


def check_values(passed: dict[str, Any], key: tuple[Any, ...]) -> None:
    """Every argument a tensor or a scalar capture.json can hold, and so every key value."""
    for name, value in passed.items():
        if not is_tensor(value) and not json_scalar(value):
            kind = type(value)
            raise NotCaptured(f"argument {name} is a {kind.__module__}.{kind.__qualname__}, "
                              "neither a tensor nor a scalar capture.json can hold")
    for i, value in enumerate(key):
        if not json_scalar(value):
            raise NotCaptured(f"key value {i + 1} ({type(value).__qualname__}) is no scalar "
                              "capture.json can hold")


def configs_with_grids(tuner: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[CapturedConfig, ...]:
    """Every config of the kernel's list, as written, with the grid it launches for this
    call: a grid function is evaluated per config with the arguments the kernel would be
    bound to (the config's values and any @triton.heuristics' among them)."""
    if "grid" not in kwargs:
        raise NotCaptured("called without a grid (not as kernel[grid](...))")
    grid = kwargs["grid"]
    signature = inspect.signature(hook.base_function(tuner))
    keywords = {k: v for k, v in kwargs.items() if k not in NOT_ARGUMENTS}
    out = []
    for i, config in enumerate(tuner.configs):
        for name, value in config.kwargs.items():
            if not json_scalar(value):
                raise NotCaptured(f"config {i + 1}'s {name} is no scalar capture.json "
                                  "can hold")
        launch = grid
        if callable(grid):
            try:
                launch = grid(_bound(tuner, signature, args, keywords, config))
            except Exception as e:
                raise NotCaptured(f"its grid function failed for config {i + 1} "
                                  f"({type(e).__name__}: {e})") from None
        out.append(CapturedConfig(
            kwargs=dict(config.kwargs), num_warps=config.num_warps,
            num_stages=config.num_stages, num_ctas=getattr(config, "num_ctas", 1),
            maxnreg=getattr(config, "maxnreg", None), pre_hook=config.pre_hook is not None,
            grid=_grid(launch, i)))
    return tuple(out)


def _bound(tuner: Any, signature: inspect.Signature, args: tuple[Any, ...],
           keywords: dict[str, Any], config: Any) -> dict[str, Any]:
    """The kernel's arguments by name as its launch binds them for config: what a grid
    function is given (Triton's JIT and its interpreter alike)."""
    extra = {**keywords, **config.all_kwargs()}
    layer = tuner.fn
    while hasattr(layer, "values"):  # @triton.heuristics, outermost first, as they run
        for name, rule in layer.values.items():
            extra[name] = rule({**dict(zip(layer.arg_names, args)), **extra})
        layer = layer.fn
    bound = signature.bind(*args, **{k: v for k, v in extra.items()
                                     if k in signature.parameters})
    bound.apply_defaults()
    return dict(bound.arguments)


def _grid(launch: Any, i: int) -> tuple[int, ...]:
    try:
        grid = tuple(int(g) for g in launch)
    except (TypeError, ValueError):
        grid = ()
    if not 1 <= len(grid) <= 3 or min(grid) < 0:
        raise NotCaptured(f"config {i + 1}'s grid is {launch!r}, not 1 to 3 sizes")
    return grid


def snapshot(passed: dict[str, Any]) -> dict[str, Any]:
    """A copy of every tensor argument as the call found it: what is saved, and what the
    launch's outputs are found against."""
    return {name: value.detach().clone() for name, value in passed.items()
            if is_tensor(value)}


def changed(passed: dict[str, Any], before: dict[str, Any]) -> tuple[str, ...]:
    """The tensor arguments the call wrote, in argument order (a NaN left as it was is
    no change)."""
    import torch

    if any(t.device.type == "cuda" for t in before.values()):
        torch.cuda.synchronize()
    out = []
    for name, old in before.items():
        new = passed[name].detach()
        same = torch.equal(old, new) or (
            old.is_floating_point() and bool(((old == new) | (old.isnan() & new.isnan()))
                                             .all()))
        if not same:
            out.append(name)
    return tuple(out)


def saved_whole(tensor: Any, save_floats: bool) -> bool:
    """Integer and boolean tensors (indices, offsets, masks) always; floating ones when
    asked, else they are re-made from a seed by their geometry."""
    return save_floats or not (tensor.is_floating_point() or tensor.is_complex())


def tensor_bytes(tensor: Any) -> bytes:
    """The tensor's elements in order, contiguous: the bytes a blob holds."""
    import torch

    flat = tensor.detach().contiguous().cpu().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def tensor_arg(tensor: Any, blob: str, zero: bool) -> TensorArg:
    """A saved tensor (blob set) is recorded as its contiguous form, the one its bytes
    hold; one re-made from the seed keeps the program's own strides."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    shape = tuple(int(n) for n in tensor.shape)
    if blob:
        strides = tuple(int(s) for s in tensor.detach().contiguous().stride())
        return TensorArg(dtype, shape, strides, int(tensor.numel()), blob, zero)
    storage = tensor.untyped_storage().nbytes() // tensor.element_size() \
        - tensor.storage_offset()
    return TensorArg(dtype, shape, tuple(int(s) for s in tensor.stride()), int(storage), "",
                     zero)


def arguments(passed: dict[str, Any], before: dict[str, Any], blobs: dict[str, str],
              zeroed: tuple[str, ...]) -> tuple[Arg, ...]:
    """The call's arguments as capture.json holds them; blobs: the digest of each saved
    tensor, by name. Geometry is the argument's own (a copy of a view is contiguous)."""
    return tuple(Arg(name, tensor=tensor_arg(value, blobs.get(name, ""), name in zeroed))
                 if name in before else Arg(name, value=value)
                 for name, value in passed.items())


def device_of(before: dict[str, Any]) -> str:
    return "cuda" if any(t.device.type == "cuda" for t in before.values()) else "cpu"
