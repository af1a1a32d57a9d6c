"""A kernel's make_inputs run for the geometry of its tensors, not their values, cheaply.

A compile needs each tensor's dtype, shape, strides and alignment (actors/compile_target.py).
torch's meta device has them without memory, but many of its answers (arithmetic, a random
draw, a `*_like`) are Python references that import sympy or torch._dynamo when first used:
3-5 s on an H200 host (benchmarks/results/heavy_compiles_fork_diag/), paid in every compile
process or in the fork server before any fork; FakeTensorMode pays the same. So a torch
function mode sends every tensor made to the meta device and answers those ops itself: a
random draw is an empty tensor of its size and dtype; a `*_like` takes its tensor's
geometry (a view's copy laid out densely, as torch lays it out); an elementwise op's
result has the broadcast shape, the layout of an input of that shape and the dtype the op
gives on one-element CPU tensors of the same ranks; an in-place elementwise or random op
leaves its tensor as it was. Anything else, and a layout asked for, runs on the meta
device as torch has it.
A geometry got wrong costs time, not a result: the worker checks that its launch loads the
binary the compile made (actors/triton_backend.py).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

META = "meta"

# Python's operator methods by the aten op they run (reflected forms alike).
_OPERATORS = {
    "add": "add", "radd": "add", "sub": "sub", "rsub": "rsub", "mul": "mul", "rmul": "mul",
    "truediv": "div", "rtruediv": "div", "div": "div", "rdiv": "div",
    "floordiv": "floor_divide", "rfloordiv": "floor_divide", "pow": "pow", "rpow": "pow",
    "mod": "remainder", "rmod": "remainder", "neg": "neg", "pos": "positive", "abs": "abs",
    "and": "bitwise_and", "rand": "bitwise_and", "or": "bitwise_or", "ror": "bitwise_or",
    "xor": "bitwise_xor", "rxor": "bitwise_xor", "invert": "bitwise_not",
    "lshift": "bitwise_left_shift", "rshift": "bitwise_right_shift",
    "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
}
_OPERATOR_OPS = frozenset(_OPERATORS.values())
# In-place ops that change a tensor's values only, besides the elementwise ones.
_FILLS = frozenset({"normal", "uniform", "random", "exponential", "bernoulli", "cauchy",
                    "log_normal", "geometric", "fill", "zero", "copy"})
_DRAWS = frozenset({"randn", "rand", "randint"})  # of a size and dtype, values unseen
_MOVES = frozenset({"cpu", "cuda", "pin_memory"})  # a tensor's move that stays on meta


@contextmanager
def on_meta() -> Iterator[None]:
    """Tensors made in here are on the meta device, whatever device they are asked for."""
    import torch
    from torch.overrides import TorchFunctionMode

    class OnMeta(TorchFunctionMode):
        def __torch_function__(self, func: Callable[..., Any], types: Any,
                               args: Sequence[Any] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            return _run(func, tuple(args), dict(kwargs or {}))

    with torch.device(META), OnMeta():
        yield


def _run(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch

    name = getattr(func, "__name__", "")
    if "device" in kwargs:
        kwargs["device"] = META
    kwargs.pop("generator", None)  # no values are drawn
    first: Any = args[0] if args else None
    meta = isinstance(first, torch.Tensor) and first.is_meta
    if name in _DRAWS and func is getattr(torch, name, None):
        return _draw(name, args, kwargs)
    if meta and name in _MOVES:
        return first
    if meta and name == "to":
        return func(*(META if isinstance(a, (str, torch.device)) else a for a in args),
                    **kwargs)
    if "memory_format" in kwargs and kwargs["memory_format"] is not torch.preserve_format:
        return func(*args, **kwargs)  # a layout asked for: torch's own answer
    if meta and name.endswith("_like"):  # randn_like, ...: only the geometry is made
        return _like(first, kwargs.get("dtype") or first.dtype)
    op, in_place = _op_of(name)
    if meta and in_place and op is not None and (op in _FILLS or _elementwise(op)):
        return first
    if not in_place and op is not None and _elementwise(op):
        return _elementwise_result(func, args, kwargs)
    return func(*args, **kwargs)


def _draw(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The draw's tensor, empty: randint(low, high, size), the others (*size) or (size)."""
    import torch

    size = kwargs.get("size")
    if size is None:
        given = args[-1:] if name == "randint" else args
        size = given[0] if len(given) == 1 and not _integer(given[0]) else given
    dtype = kwargs.get("dtype") or (torch.int64 if name == "randint" else None)
    return torch.empty(tuple(size), dtype=dtype, device=META)


def _integer(value: Any) -> bool:
    """An int, numpy's too: a size of one dimension, not a sequence of them."""
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _like(tensor: Any, dtype: Any) -> Any:
    """An empty tensor laid out as torch lays out a copy of tensor: its strides where it
    is dense (a permutation of a contiguous layout), else dense strides in the order of
    its own (as torch's empty_like and clone do)."""
    import torch

    order = sorted(range(tensor.dim()), key=lambda d: tensor.stride(d))
    strides, expected, dense = [0] * tensor.dim(), 1, True
    for d in order:
        if tensor.size(d) != 1 and tensor.stride(d) != expected:
            dense = False
        strides[d] = expected
        expected *= max(tensor.size(d), 1)
    shape = tuple(tensor.shape)
    return torch.empty_strided(shape, tensor.stride() if dense else tuple(strides),
                               dtype=dtype, device=META)


def _op_of(name: str) -> tuple[str | None, bool]:
    """(the aten op a torch function runs, whether in place), as far as its name says."""
    if name.startswith("__") and name.endswith("__"):
        bare = name[2:-2]
        if bare in _OPERATORS:
            return _OPERATORS[bare], False
        if bare.startswith("i") and bare[1:] in _OPERATORS:
            return _OPERATORS[bare[1:]], True
        return None, False
    if name.endswith("_") and not name.startswith("_"):
        return name[:-1], True
    return (name or None), False


@functools.cache
def _elementwise(op: str) -> bool:
    import torch

    if op in _OPERATOR_OPS:
        return True
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return False
    try:
        return any(torch.Tag.pointwise in getattr(packet, overload).tags
                   for overload in packet.overloads())
    except (AttributeError, RuntimeError):
        return False


def _elementwise_result(func: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
    import torch

    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if not tensors or not all(t.is_meta for t in tensors) or "out" in kwargs:
        return func(*args, **kwargs)

    def tiny(value: Any) -> Any:  # of the same rank: promotion treats 0-d ones apart
        return torch.ones((1,) * value.dim(), dtype=value.dtype, device="cpu") \
            if isinstance(value, torch.Tensor) else value

    sample = func(*(tiny(a) for a in args), **{k: tiny(v) for k, v in kwargs.items()})
    if not isinstance(sample, torch.Tensor):
        return func(*args, **kwargs)
    shape = _broadcast([tuple(t.shape) for t in tensors])
    like = next((t for t in tensors if tuple(t.shape) == shape), None)
    if like is not None:
        return _like(like, sample.dtype)
    return torch.empty(shape, dtype=sample.dtype, device=META)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """torch.broadcast_shapes's answer (which imports sympy) for sizes that broadcast."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + s for s in shapes]
    return tuple(max(sizes) if 0 not in sizes else 0 for sizes in zip(*padded))
