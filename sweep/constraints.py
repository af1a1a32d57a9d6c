"""Constraint expressions: arithmetic and comparisons over parameter names, never eval().

An expression is parsed with `ast`, checked against a whitelist of node types, and turned
into a tree of small closures that evaluate over whole numpy columns at once, so a space of
millions of points is filtered in milliseconds.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Columns = Mapping[str, np.ndarray]
Evaluator = Callable[[Columns], np.ndarray]

def _by_nonzero(op: Callable) -> Callable:
    """Division where a zero divisor gives NaN, which then fails every comparison: a
    config whose constraint cannot be evaluated is left out rather than crashing."""

    def divide(a: Any, b: Any) -> Any:
        zero = np.asarray(b) == 0
        if not zero.any():
            return op(a, b)
        safe = np.where(zero, 1, b).astype(float)
        return np.where(zero, np.nan, op(np.asarray(a, dtype=float), safe))

    return divide


_BINARY: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: _by_nonzero(operator.truediv), ast.FloorDiv: _by_nonzero(operator.floordiv),
    ast.Mod: _by_nonzero(operator.mod), ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_UNARY: dict[type, Callable] = {ast.USub: operator.neg, ast.UAdd: operator.pos,
                                ast.Not: np.logical_not}


class ConstraintError(ValueError):
    """The expression does not parse, uses something other than arithmetic and comparisons,
    or names an unknown parameter."""


@dataclass(frozen=True)
class Constraint:
    text: str
    names: frozenset[str]
    evaluate: Evaluator

    def mask(self, columns: Columns, n: int) -> np.ndarray:
        with np.errstate(all="ignore"):
            result = np.asarray(self.evaluate(columns))
        if result.dtype != bool:
            # Non-boolean results (e.g. "BLOCK_K % 32") follow Python truthiness; NaN fails.
            result = np.nan_to_num(result.astype(float), nan=0.0) != 0
        return np.broadcast_to(result, (n,))


def parse_constraint(text: str, parameters: set[str] | frozenset[str]) -> Constraint:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ConstraintError(f"does not parse ({e.msg})") from None
    names: set[str] = set()
    evaluate = _compile(tree.body, parameters, names)
    return Constraint(text=text, names=frozenset(names), evaluate=evaluate)


def _compile(node: ast.AST, parameters: set[str] | frozenset[str], names: set[str]) -> Evaluator:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        value = node.value
        return lambda cols: value
    if isinstance(node, ast.Name):
        if node.id not in parameters:
            known = ", ".join(sorted(parameters))
            raise ConstraintError(f"unknown parameter {node.id!r} (parameters: {known})")
        names.add(node.id)
        name = node.id
        return lambda cols: cols[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op = _BINARY[type(node.op)]
        left = _compile(node.left, parameters, names)
        right = _compile(node.right, parameters, names)
        return lambda cols: op(left(cols), right(cols))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        op = _UNARY[type(node.op)]
        operand = _compile(node.operand, parameters, names)
        return lambda cols: op(operand(cols))
    if isinstance(node, ast.BoolOp):
        parts = [_compile(v, parameters, names) for v in node.values]
        combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        return lambda cols: functools.reduce(combine, [p(cols) for p in parts])
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        terms = [_compile(node.left, parameters, names)]
        terms += [_compile(c, parameters, names) for c in node.comparators]
        ops = [_COMPARE[type(op)] for op in node.ops]

        def compare(cols: Columns) -> np.ndarray:
            values = [t(cols) for t in terms]
            pairs = [np.asarray(op(a, b)) for op, a, b in zip(ops, values, values[1:])]
            return functools.reduce(np.logical_and, pairs)

        return compare
    what = type(node).__name__
    raise ConstraintError(f"{what} is not allowed (use arithmetic, comparisons, and/or/not)")
