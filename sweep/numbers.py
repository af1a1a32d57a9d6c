"""Numbers as a person reads them, in every view of a run alike: never scientific notation
in the range a run produces, rates in the SI unit that puts them between 1 and 1000.

The text report, the HTML report and the PNGs format here, one unit per column; the HTML
page's own script formats by the same rules (page.html's `num`); JSON output stays numeric
and is not formatted here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# SI prefixes by power of 1000, from 10^-3 (milli) to 10^18 (exa).
_PREFIXES = {-1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}
# Fixed notation from 10^-6 to below 10^15; beyond that (no run's figure) an exponent.
_FIXED = range(-6, 15)


def significant(value: float, digits: int = 4, *, grouped: bool = False) -> str:
    """`digits` significant digits in fixed notation, trailing zeros dropped, every digit
    of the integer part kept: 1100 and 694 (not 1.1e+03), 0.01234, 2.1. grouped: with
    thousands separators (4,720)."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    # The exponent after rounding to `digits` digits (9.9996 is 10.00, not 9.9996).
    exponent = int(f"{abs(value):.{digits - 1}e}".split("e")[1])
    if exponent not in _FIXED:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - exponent)
    text = f"{value:{',' if grouped else ''}.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def ratio(value: float) -> str:
    """A ratio such as a speed-up, three significant digits: 4,720, 1.61, 2."""
    return significant(value, 3, grouped=True)


def scale(values: Iterable[float | None], unit: str) -> tuple[str, float]:
    """One SI unit for a column of amounts in `unit` (per second, or per launch): the
    unit that puts the largest between 1 and 1000, and the factor each value is
    multiplied by to be read in it. ("MFLOP/s", 1e-6) for a column of about 1.6e7 FLOP/s."""
    largest = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
    power = 0
    if largest > 0:
        # By the value as rounded to three digits: 999.96 reads 1.00 k, not 1000.
        power = int(f"{largest:.2e}".split("e")[1]) // 3
        power = min(max(power, min(_PREFIXES)), max(_PREFIXES))
    return f"{_PREFIXES[power]}{unit}", 1000.0 ** -power


def amount(value: float, unit: str, digits: int = 3) -> str:
    """One amount in the SI unit that puts it between 1 and 1000: 16.2 MFLOP/s,
    378 kB/s, 1.23 TFLOP/s, 4.19 MFLOP."""
    name, factor = scale([value], unit)
    return f"{significant(value * factor, digits)} {name}"
