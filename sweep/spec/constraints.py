"""Constraint expressions: arithmetic and comparisons over parameter names, never eval().

Besides parameters, an expression may name constants (the problem's values, say): each is
compiled into the expression as its value, of the kind its Python type gives, so the space
is filtered over the parameters' columns alone.

An expression is parsed with `ast`, checked against a whitelist of node types and a small
static type check, and turned into a tree of small closures that evaluate over whole numpy
columns at once, so a space of millions of points is filtered in milliseconds.

Kinds. Every node is a number, a string or a boolean. Arithmetic takes numbers (a boolean
counts as the number 0 or 1, as in Python); ordering comparisons take two numbers or two
strings; == and != take two of the same kind (booleans compare as numbers); and/or/not take
numbers or booleans; and a constraint's result is a boolean or a number (true when
non-zero). A mismatch is a ConstraintError when the spec is loaded, never a crash while the
space is filtered.

Arithmetic. Numbers are evaluated in float64: integers are exact up to 2**53 (larger int64
parameters compare approximately). So no operation can spin or allocate more than a column,
as Python's big ints would (`10**10**10`). Overflow gives inf; a zero divisor or an
undefined result gives NaN, which fails every comparison and is false as a truth value, so
such a config is left out rather than crashing the sweep.
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
Value = Any  # a column (numpy array) or a scalar: np.float64, np.bool_ or str
Evaluator = Callable[[Columns], Value]

NUMBER, STRING, BOOLEAN = "number", "string", "boolean"
# The kind of a parameter whose values have this Python type (sweep.spec.space.value_kind).
KIND_OF_TYPE: dict[type, str] = {bool: BOOLEAN, int: NUMBER, float: NUMBER, str: STRING}
NUMERIC = (NUMBER, BOOLEAN)

MAX_CHARS = 1_000
# Each level is a few Python frames when compiling and evaluating; 100 stays far from the
# interpreter's recursion limit while allowing any expression a person would write.
MAX_DEPTH = 100


def clip_text(text: str, limit: int = 80) -> str:
    """text, cut to at most `limit` characters with an ellipsis; keeps error lines short."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip_repr(value: Any, limit: int = 80) -> str:
    """repr(value), cut to at most `limit` characters with an ellipsis."""
    return clip_text(repr(value), limit)


def _divide(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Division where a zero divisor gives NaN, which then fails every comparison: a
    config whose constraint cannot be evaluated is left out rather than crashing."""

    def divide(a: Any, b: Any) -> Any:
        zero = np.asarray(b) == 0
        return np.where(zero, np.nan, op(a, np.where(zero, 1.0, b)))

    return divide


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: _divide(operator.truediv), ast.FloorDiv: _divide(operator.floordiv),
    ast.Mod: _divide(operator.mod), ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_EQUALITY = (ast.Eq, ast.NotEq)
_SYMBOL: dict[type, str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
    ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
    ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~", ast.USub: "-",
    ast.UAdd: "+", ast.Not: "not", ast.And: "and", ast.Or: "or", ast.Eq: "==",
    ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
    ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_ALLOWED = "use arithmetic, comparisons, and/or/not"


class ConstraintError(ValueError):
    """The expression does not parse, uses something other than arithmetic and comparisons,
    mixes kinds (e.g. a number and a string), or names an unknown parameter or constant."""


def truth(value: Value) -> np.ndarray:
    """Python truthiness over a column: a boolean as is, a number when non-zero; NaN is
    false (its config could not be evaluated)."""
    array = np.asarray(value)
    if array.dtype == bool:
        return array
    return (array != 0) & ~np.isnan(array)


@dataclass(frozen=True)
class Constraint:
    text: str
    names: frozenset[str]
    evaluate: Evaluator

    def mask(self, columns: Columns, n: int) -> np.ndarray:
        with np.errstate(all="ignore"):
            result = truth(self.evaluate(columns))
        return np.broadcast_to(result, (n,))


def parse_constraint(text: str, parameters: Mapping[str, type],
                     constants: Mapping[str, Any] | None = None, *,
                     unknown: str = "") -> Constraint:
    """Compile `text` over `parameters` (each name's Python value type: bool, int, float or
    str) and `constants` (name -> a bool, int, float or str; a parameter of the same name
    wins). Constraint.names holds only the parameters it reads. unknown: what an unknown
    name's message says was expected (default: the parameters)."""
    source = text.strip()
    if len(source) > MAX_CHARS:
        raise ConstraintError(f"is {len(source):,} characters long; at most {MAX_CHARS:,}")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise ConstraintError(f"does not parse ({clip_text(str(e.msg))})") from None
    except (RecursionError, MemoryError, ValueError, OverflowError) as e:
        raise ConstraintError(f"does not parse ({type(e).__name__})") from None
    names: set[str] = set()
    known = {n: v for n, v in (constants or {}).items() if n not in parameters}
    compiler = _Compiler(source, {n: KIND_OF_TYPE[t] for n, t in parameters.items()}, names,
                         known, unknown)
    try:
        evaluate, kind = compiler.compile(tree.body, 0)
    except (RecursionError, MemoryError) as e:
        raise ConstraintError(f"is too complex ({type(e).__name__})") from None
    if kind == STRING:
        raise ConstraintError("is a string; a constraint must be a comparison or a number")
    return Constraint(text=text, names=frozenset(names), evaluate=evaluate)


def _a(kind: str) -> str:
    return f"a {kind}"


def _as_number(value: Any) -> np.float64:
    try:
        return np.float64(float(value))
    except OverflowError:
        raise ConstraintError(f"the number {clip_repr(value)} is too large") from None


@dataclass
class _Compiler:
    source: str
    kinds: Mapping[str, str]
    names: set[str]
    constants: Mapping[str, Any]
    unknown: str

    def compile(self, node: ast.AST, depth: int) -> tuple[Evaluator, str]:
        """(evaluator, kind) of node; numbers evaluate to float64 columns or scalars."""
        if depth > MAX_DEPTH:
            raise ConstraintError(f"nests deeper than {MAX_DEPTH} levels")
        depth += 1
        if isinstance(node, ast.Constant):
            return self.constant(node.value)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare)):
            return self.operation(node, depth)
        raise ConstraintError(f"{type(node).__name__} is not allowed ({_ALLOWED})")

    def constant(self, value: Any) -> tuple[Evaluator, str]:
        if isinstance(value, bool):
            number = np.float64(value)
            return (lambda cols: number), BOOLEAN
        if isinstance(value, (int, float)):
            number = _as_number(value)
            return (lambda cols: number), NUMBER
        if isinstance(value, str):
            return (lambda cols: value), STRING
        raise ConstraintError(f"the constant {clip_repr(value)} is not allowed "
                              "(use numbers, strings, True or False)")

    def name(self, node: ast.Name) -> tuple[Evaluator, str]:
        written = ast.get_source_segment(self.source, node)
        if written is not None and written != node.id:
            # Python's parser NFKC-normalises identifiers, so this would silently read
            # another parameter.
            raise ConstraintError(f"the name {clip_repr(written)} is read by Python as "
                                  f"{node.id!r}; write {node.id!r}")
        if node.id in self.constants and node.id not in self.kinds:
            return self.constant(self.constants[node.id])
        if node.id not in self.kinds:
            if self.unknown:
                raise ConstraintError(f"unknown name {clip_repr(node.id)} ({self.unknown})")
            known = clip_text(", ".join(sorted(self.kinds)), 200)
            raise ConstraintError(f"unknown parameter {clip_repr(node.id)} (parameters: {known})")
        self.names.add(node.id)
        name, kind = node.id, self.kinds[node.id]
        if kind == STRING:
            return (lambda cols: cols[name]), STRING
        return (lambda cols: np.asarray(cols[name], dtype=np.float64)), kind

    def operation(self, node: ast.AST, depth: int) -> tuple[Evaluator, str]:
        if isinstance(node, ast.BinOp):
            return self.binary(node, depth)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node, depth)
        if isinstance(node, ast.BoolOp):
            return self.boolean(node, depth)
        assert isinstance(node, ast.Compare)
        return self.compare(node, depth)

    def binary(self, node: ast.BinOp, depth: int) -> tuple[Evaluator, str]:
        symbol = _SYMBOL.get(type(node.op), type(node.op).__name__)
        if type(node.op) not in _BINARY:
            raise ConstraintError(f"the operator {symbol} is not allowed ({_ALLOWED})")
        op = _BINARY[type(node.op)]
        left, left_kind = self.compile(node.left, depth)
        right, right_kind = self.compile(node.right, depth)
        if left_kind not in NUMERIC or right_kind not in NUMERIC:
            raise ConstraintError(f"{symbol} needs numbers, got {_a(left_kind)} and "
                                  f"{_a(right_kind)}")
        return (lambda cols: op(left(cols), right(cols))), NUMBER

    def unary(self, node: ast.UnaryOp, depth: int) -> tuple[Evaluator, str]:
        symbol = _SYMBOL.get(type(node.op), type(node.op).__name__)
        operand, kind = self.compile(node.operand, depth)
        if isinstance(node.op, ast.Not):
            if kind not in NUMERIC:
                raise ConstraintError(f"not needs a number or a boolean, got {_a(kind)}")
            return (lambda cols: np.logical_not(truth(operand(cols)))), BOOLEAN
        if isinstance(node.op, (ast.USub, ast.UAdd)):
            if kind not in NUMERIC:
                raise ConstraintError(f"{symbol} needs a number, got {_a(kind)}")
            sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
            return (lambda cols: sign * operand(cols)), NUMBER
        raise ConstraintError(f"the operator {symbol} is not allowed ({_ALLOWED})")

    def boolean(self, node: ast.BoolOp, depth: int) -> tuple[Evaluator, str]:
        symbol = _SYMBOL[type(node.op)]
        parts = []
        for value in node.values:
            part, kind = self.compile(value, depth)
            if kind not in NUMERIC:
                raise ConstraintError(f"{symbol} needs numbers or booleans, got {_a(kind)}")
            parts.append(part)
        combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        return (lambda cols: functools.reduce(combine, [truth(p(cols)) for p in parts])), \
            BOOLEAN

    def compare(self, node: ast.Compare, depth: int) -> tuple[Evaluator, str]:
        compiled = [self.compile(n, depth) for n in [node.left, *node.comparators]]
        ops = []
        for op, (_, left), (_, right) in zip(node.ops, compiled, compiled[1:]):
            symbol = _SYMBOL.get(type(op), type(op).__name__)
            if type(op) not in _COMPARE:
                raise ConstraintError(f"the operator {symbol} is not allowed ({_ALLOWED})")
            numbers = left in NUMERIC and right in NUMERIC
            if not numbers and not left == right == STRING:
                needs = "the same kind" if isinstance(op, _EQUALITY) else \
                    "two numbers or two strings"
                raise ConstraintError(f"{symbol} needs {needs}, got {_a(left)} and "
                                      f"{_a(right)}")
            ops.append(_COMPARE[type(op)])
        terms = [t for t, _ in compiled]

        def evaluate(cols: Columns) -> np.ndarray:
            values = [t(cols) for t in terms]
            pairs = [np.asarray(op(a, b)) for op, a, b in zip(ops, values, values[1:])]
            return functools.reduce(np.logical_and, pairs)

        return evaluate, BOOLEAN
