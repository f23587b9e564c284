"""Regexes for JSON numbers, including exact ranges for ``minimum``/``maximum`` bounds.

Policies (stated and tested):
- integers are written without fraction or exponent and without ``-0``;
- numbers without bounds: ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``;
- numbers with bounds are written without exponent; bounds must be integer-valued
  (``minimum: 0.5`` is a compile error naming the keyword).
"""
from __future__ import annotations

from . import regex_ast as ra
from .regex_parser import parse_regex

DIGIT = ra.chars(((48, 57),))
NONZERO = ra.chars(((49, 57),))
ANY_INT = parse_regex(r"0|-?[1-9][0-9]*")
ANY_NUMBER = parse_regex(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
ANY_FRACTION = parse_regex(r"(\.[0-9]+)?")
ZERO_FRACTION = parse_regex(r"(\.0+)?")
NONZERO_FRACTION = parse_regex(r"\.[0-9]*[1-9][0-9]*")


def int_range(lo: int | None, hi: int | None) -> tuple:
    """Decimal integers n with lo <= n <= hi (None = unbounded), canonical form."""
    if lo is None and hi is None:
        return ANY_INT
    if lo is not None and hi is not None and lo > hi:
        return ra.NOTHING
    parts = []
    if hi is None or hi >= 0:
        parts.append(nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        low_magnitude = 1 if hi is None or hi >= 0 else -hi
        parts.append(ra.seq(ra.char("-"), nonneg_range(low_magnitude, None if lo is None else -lo)))
    return ra.alt(*parts)


def nonneg_range(a: int, b: int | None) -> tuple:
    if b is not None and a > b:
        return ra.NOTHING
    if b is None:
        width = len(str(a))
        longer = ra.seq(NONZERO, ra.rep(DIGIT, width, None))
        return ra.alt(nonneg_range(a, 10 ** width - 1), longer)
    parts = []
    for width in range(len(str(a)), len(str(b)) + 1):
        low = max(a, 0 if width == 1 else 10 ** (width - 1))
        high = min(b, 10 ** width - 1)
        if low <= high:
            parts.append(_fixed_width(str(low), str(high)))
    return ra.alt(*parts)


def _fixed_width(low: str, high: str) -> tuple:
    """Digit strings of equal length between low and high inclusive."""
    if not low:
        return ra.EMPTY
    first_low, first_high = int(low[0]), int(high[0])
    if first_low == first_high:
        return ra.seq(ra.char(low[0]), _fixed_width(low[1:], high[1:]))
    rest = len(low) - 1
    parts = [ra.seq(ra.char(low[0]), _fixed_width(low[1:], "9" * rest))]
    if first_high - first_low > 1:
        middle = ra.chars(((48 + first_low + 1, 48 + first_high - 1),))
        parts.append(ra.seq(middle, ra.rep(DIGIT, rest, rest)))
    parts.append(ra.seq(ra.char(high[0]), _fixed_width("0" * rest, high[1:])))
    return ra.alt(*parts)


def number_range(lo, lo_inclusive: bool, hi, hi_inclusive: bool) -> tuple:
    """Decimal numbers x (no exponent) with integer bounds lo (<=|<) x (<=|<) hi."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and hi_inclusive):
        a, a_incl = (0, True) if lo is None or lo < 0 else (lo, lo_inclusive)
        parts.append(_nonneg_decimal(a, a_incl, hi, hi_inclusive))
    if lo is None or lo < 0:
        # x = -y with y > 0: the bounds swap sides.
        y_lo, y_lo_incl = (0, False) if hi is None or hi >= 0 else (-hi, hi_inclusive)
        y_hi = None if lo is None else -lo
        parts.append(ra.seq(ra.char("-"), _positive_decimal(y_lo, y_lo_incl, y_hi, lo_inclusive)))
    return ra.alt(*parts)


def _nonneg_decimal(a: int, a_incl: bool, b, b_incl: bool) -> tuple:
    if b is not None and (a > b or (a == b and not (a_incl and b_incl))):
        return ra.NOTHING
    if b is not None and a == b:
        return ra.seq(int_range(a, a), ZERO_FRACTION)
    parts = [ra.seq(int_range(a, a), ANY_FRACTION if a_incl else NONZERO_FRACTION)]
    parts.append(ra.seq(int_range(a + 1, None if b is None else b - 1), ANY_FRACTION))
    if b is not None and b_incl:
        parts.append(ra.seq(int_range(b, b), ZERO_FRACTION))
    return ra.alt(*parts)


def _positive_decimal(a: int, a_incl: bool, b, b_incl: bool) -> tuple:
    """y > 0 within the bounds (a may be 0 exclusive)."""
    if a == 0 and not a_incl:
        if b is not None and b == 0:
            return ra.NOTHING
        zero_point = ra.seq(ra.char("0"), NONZERO_FRACTION)
        upper = b - 1 if b is not None else None
        parts = [zero_point]
        if upper is None or upper >= 1:
            parts.append(ra.seq(int_range(1, upper), ANY_FRACTION))
        if b is not None and b >= 1 and b_incl:
            parts.append(ra.seq(int_range(b, b), ZERO_FRACTION))
        return ra.alt(*parts)
    return _nonneg_decimal(a, a_incl, b, b_incl)
