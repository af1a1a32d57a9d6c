import subprocess
import sys

import numpy as np
import pytest

from sweep.spec.constraints import ConstraintError, parse_constraint

COLS = {"A": np.array([16, 32, 64]), "B": np.array([1, 2, 4]),
        "S": np.array(["x", "y", "x"], dtype=object)}
PARAMS = {"A": int, "B": int, "S": str}


@pytest.mark.parametrize(("text", "expected"), [
    ("A * B <= 64", [True, True, False]),
    ("A // B == 16", [True, True, True]),
    ("A % 32 == 0", [False, True, True]),
    ("16 < A <= 32", [False, True, False]),
    ("A >= 32 and B < 4", [False, True, False]),
    ("A == 16 or not B == 2", [True, False, True]),
    ("-A + 2 ** 5 > 0", [True, False, False]),
    ("S == 'x'", [True, False, True]),
    ("A / (B - 2) > 0", [False, False, True]),  # division by zero excludes, never crashes
    ("A % 32", [True, False, False]),  # a number is true when non-zero, as in Python
])
def test_constraint_evaluates_over_columns_like_python(text, expected):
    c = parse_constraint(text, PARAMS)
    assert c.mask(COLS, 3).tolist() == expected


@pytest.mark.parametrize(("text", "fragment"), [
    ("BLOK_M > 2", "unknown parameter 'BLOK_M'"),
    ("__import__('os').system('true')", "Call is not allowed"),
    ("A.real > 1", "Attribute is not allowed"),
    ("[A][0] > 1", "not allowed"),
    ("(lambda: 1)()", "not allowed"),
    ("A >", "does not parse"),
    ("A in (1, 2)", "not allowed"),
    ("A if B else 2", "IfExp is not allowed"),
])
def test_constraint_refuses_anything_but_arithmetic_and_comparisons(text, fragment):
    with pytest.raises(ConstraintError, match=None) as e:
        parse_constraint(text, PARAMS)
    assert fragment in str(e.value)


def test_constraint_records_the_names_it_reads():
    assert parse_constraint("A * 2 < B", PARAMS).names == {"A", "B"}


BOOLS = {"A": int, "F": bool, "S": str, "X": float}
MIXED = {"A": np.array([1, 2, 3]), "F": np.array([True, False, True]),
         "S": np.array(["a", "b", "c"], dtype=object), "X": np.array([0.5, 2.0, -1.0])}


@pytest.mark.parametrize(("text", "expected"), [
    ("F + A >= 2", [True, True, True]),  # a boolean counts as 0 or 1 in arithmetic
    ("F == 1", [True, False, True]),
    ("not F or A > 2", [False, True, True]),
    ("A and X > 0", [True, True, False]),
    ("S < 'b' or S >= 'c'", [True, False, True]),
    ("A / X > 1", [True, False, False]),
    ("X ** 0.5 >= 0", [True, True, False]),  # NaN (no real root) fails the comparison
    ("A % 2", [True, False, True]),
    ("(A - 2) / (A - 2) == 1", [True, False, True]),  # a zero divisor excludes the config
])
def test_well_typed_mixes_of_kinds_follow_python(text: str, expected: list[bool]) -> None:
    assert parse_constraint(text, BOOLS).mask(MIXED, 3).tolist() == expected


@pytest.mark.parametrize(("text", "fragment"), [
    ("A + 'x' > 1", "+ needs numbers, got a number and a string"),
    ("'x' * 10**10 == S", "* needs numbers, got a string and a number"),
    ("'x' < A", "< needs two numbers or two strings, got a string and a number"),
    ("S == 1", "== needs the same kind, got a string and a number"),
    ("F != 'x'", "!= needs the same kind, got a boolean and a string"),
    ("S and A > 1", "and needs numbers or booleans, got a string"),
    ("not S", "not needs a number or a boolean, got a string"),
    ("-S < 1", "- needs a number, got a string"),
    ("S", "is a string; a constraint must be a comparison or a number"),
    ("A < 1" + "0" * 400, "is too large"),
    ("A < None", "the constant None is not allowed"),
    ("A & 1", "the operator & is not allowed"),
])
def test_mismatched_kinds_are_refused_when_parsed_naming_operator_and_kinds(
        text: str, fragment: str) -> None:
    with pytest.raises(ConstraintError) as e:
        parse_constraint(text, BOOLS)
    assert fragment in str(e.value)


@pytest.mark.parametrize(("text", "fragment"), [
    (" + ".join(["A"] * 300) + " > 1", "characters long; at most 1,000"),
    ("-" * 150 + "A > 1", "nests deeper than 100 levels"),
    ("-" * 5000 + "A > 1", "characters long; at most 1,000"),
    ("(" * 250 + "A" + ")" * 250 + " > 1", "does not parse"),
    ("A\0 > 1", "does not parse"),
])
def test_overlong_or_deeply_nested_expression_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(ConstraintError) as e:
        parse_constraint(text, BOOLS)
    assert fragment in str(e.value)


def test_a_name_python_would_normalise_to_a_parameter_is_refused() -> None:
    # NFKC turns the fraktur ℌ into H: the expression would silently read parameter H.
    with pytest.raises(ConstraintError) as e:
        parse_constraint("ℌ > 1", {"H": int})
    assert "'ℌ' is read by Python as 'H'; write 'H'" in str(e.value)


HOSTILE_ARITHMETIC = """
import numpy as np
from sweep.spec.constraints import parse_constraint
cols = {"A": np.arange(1, 1001)}
for text, kept in [("10**10**10 > A", 1000), ("A ** 10**6 > 1", 999),
                   ("2 ** A ** A > 0", 1000), ("(A * 1e308) * 1e308 > 1e308", 1000),
                   ("A // 0 == 0", 0), ("A % (A - A) >= 0", 0)]:
    assert parse_constraint(text, {"A": int}).mask(cols, 1000).sum() == kept, text
print("ok")
"""


def test_constant_arithmetic_is_float64_so_it_cannot_spin_or_allocate() -> None:
    """Python's big ints would take forever on 10**10**10: run it where a hang is a
    timeout, not a stuck test session."""
    result = subprocess.run([sys.executable, "-c", HOSTILE_ARITHMETIC], capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
