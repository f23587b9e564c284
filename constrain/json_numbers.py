"""Regexes for JSON numbers, including exact ranges for ``minimum``/``maximum`` bounds, and
number schemas (``number_schema``: bounds, ``multipleOf``, integer formats).

Policies (stated and tested):
- integers are written without fraction or exponent and without ``-0``;
- numbers without bounds: ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``;
- numbers with bounds are written without exponent; bounds are exact decimals (``0.5``,
  ``1e-3`` and big integers all work) compared digit by digit.
"""
from __future__ import annotations

import math
from decimal import Decimal

from . import regex_ast as ra
from .errors import SchemaError
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
    if low == "0" * len(low) and high == "9" * len(high):
        return ra.rep(DIGIT, len(low), len(low))
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
    """Decimal numbers x (no exponent) with lo (<=|<) x (<=|<) hi; bounds are any JSON numbers
    (None = unbounded). Exact: the bound's digits are compared digit by digit."""
    lo = None if lo is None else _decimal(lo)
    hi = None if hi is None else _decimal(hi)
    parts = []
    zero = Decimal(0)
    if hi is None or hi > zero or (hi == zero and hi_inclusive):
        a, a_incl = (zero, True) if lo is None or lo < zero else (lo, lo_inclusive)
        parts.append(_magnitude_range(a, a_incl, hi, hi_inclusive))
    if lo is None or lo < zero:
        # x = -y with y > 0: the bounds swap sides.
        y_lo, y_lo_incl = (zero, False) if hi is None or hi >= zero else (-hi, hi_inclusive)
        y_hi = None if lo is None else -lo
        parts.append(ra.seq(ra.char("-"), _magnitude_range(y_lo, y_lo_incl, y_hi, lo_inclusive,
                                                           positive=True)))
    return ra.alt(*parts)


def _decimal(value) -> Decimal:
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _split(value: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    text = format(value, "f")
    whole, _, frac = text.partition(".")
    return int(whole), frac.rstrip("0")


def _magnitude_range(a: Decimal, a_incl: bool, b, b_incl: bool, positive: bool = False) -> tuple:
    """Unsigned decimals I(.D)? between a and b; ``positive`` also excludes every zero."""
    if b is not None and (a > b or (a == b and not (a_incl and b_incl))):
        return ra.NOTHING
    ai, af = _split(a)
    parts = []
    if b is None:
        parts.append(ra.seq(int_range(ai, ai), _fraction(af, ">=" if a_incl else ">", None, None)))
        parts.append(ra.seq(int_range(ai + 1, None), ANY_FRACTION))
    else:
        bi, bf = _split(b)
        low_op, high_op = (">=" if a_incl else ">"), ("<=" if b_incl else "<")
        if ai == bi:
            parts.append(ra.seq(int_range(ai, ai), _fraction(af, low_op, bf, high_op)))
        else:
            parts.append(ra.seq(int_range(ai, ai), _fraction(af, low_op, None, None)))
            if bi - ai > 1:
                parts.append(ra.seq(int_range(ai + 1, bi - 1), ANY_FRACTION))
            parts.append(ra.seq(int_range(bi, bi), _fraction(None, None, bf, high_op)))
    node = ra.alt(*parts)
    if positive:
        node = ("diff", node, ra.seq(ra.char("0"), ZERO_FRACTION))
    return node


def _fraction(low, low_op, high, high_op) -> tuple:
    """The optional ``.D`` part with 0.D compared to 0.low and 0.high."""
    conditions = []
    if low_op is not None:
        conditions.append(_digits_compare(low, low_op))
    if high_op is not None:
        conditions.append(_digits_compare(high, high_op))
    digits = ra.rep(DIGIT, 0, None)
    for condition in conditions:
        digits = ("and", digits, condition)
    nonempty = ("and", digits, ra.rep(DIGIT, 1, None))
    empty_ok = all(_empty_satisfies(bound, op) for bound, op in ((low, low_op), (high, high_op))
                   if op is not None)
    dotted = ra.seq(ra.char("."), nonempty)
    return ra.alt(ra.EMPTY, dotted) if empty_ok else dotted


def _empty_satisfies(bound: str, op: str) -> bool:
    zero = not bound
    return {">=": zero, ">": False, "<=": True, "<": not zero}[op]


def _digits_compare(bound: str, op: str) -> tuple:
    """Digit strings D (maybe empty) with 0.D <op> 0.bound."""
    any_digits = ra.rep(DIGIT, 0, None)
    if not bound:
        return {">=": any_digits,
                ">": ra.seq(any_digits, NONZERO, any_digits),
                "<=": ra.rep(ra.char("0"), 0, None),
                "<": ra.NOTHING}[op]
    f = int(bound[0])
    rest = _digits_compare(bound[1:], op)
    same = ra.seq(ra.char(bound[0]), rest)
    if op in (">=", ">"):
        bigger = ra.seq(ra.chars(((49 + f, 57),)), any_digits) if f < 9 else ra.NOTHING
        return ra.alt(bigger, same)
    smaller = ra.seq(ra.chars(((48, 47 + f),)), any_digits) if f > 0 else ra.NOTHING
    return ra.alt(ra.EMPTY, smaller, same)


# ---- number schemas ----------------------------------------------------------------------
def number_schema(schema: dict, path: str, integer: bool) -> tuple:
    """The JSON text of a number (an integer if ``integer``) meeting ``schema``'s numeric
    keywords (bounds, ``multipleOf``, the ``int32``/``int64``/... formats)."""
    node = _number_range(schema, path, integer)
    step = schema.get("multipleOf")
    if step is None:
        return node
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
        raise SchemaError("multipleOf must be a positive number", f"{path}/multipleOf")
    multiple = _multiple_node(step, path)
    if ra.has_rules(node):
        raise SchemaError("multipleOf on an unbounded value", f"{path}/multipleOf")
    if integer or node is ANY_NUMBER:
        # canonical forms only: integers plain, numbers without exponent
        node = int_range(None, None) if integer else number_range(None, True, None, True)
    return ("and", node, multiple)


def _number_range(schema: dict, path: str, integer: bool) -> tuple:
    lo, lo_incl, hi, hi_incl = _bounds(schema, path)
    fmt = schema.get("format")
    if integer and fmt in ("int32", "int64", "uint32", "uint64"):
        bits = int(fmt[-2:])
        f_lo, f_hi = (0, 2 ** bits - 1) if fmt.startswith("u") else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
        lo = f_lo if lo is None else max(lo, f_lo)
        hi = f_hi if hi is None else min(hi, f_hi)
    if integer:
        ilo = None if lo is None else (math.ceil(lo) if lo_incl else math.floor(lo) + 1)
        ihi = None if hi is None else (math.floor(hi) if hi_incl else math.ceil(hi) - 1)
        return int_range(ilo, ihi)
    if lo is None and hi is None:
        return ANY_NUMBER
    return number_range(lo, lo_incl, hi, hi_incl)


def _bounds(schema: dict, path: str):
    """(lo, lo_inclusive, hi, hi_inclusive) from the four bound keywords (draft 4's boolean
    ``exclusiveMinimum``/``exclusiveMaximum`` included); None = unbounded."""
    lo, lo_incl, hi, hi_incl = None, True, None, True
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)):
            raise SchemaError(f"{key} must be a number", f"{path}/{key}")
    if isinstance(schema.get("minimum"), (int, float)) and not isinstance(schema["minimum"], bool):
        lo = schema["minimum"]
    if isinstance(schema.get("maximum"), (int, float)) and not isinstance(schema["maximum"], bool):
        hi = schema["maximum"]
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if ex_lo is True:            # draft 4 boolean form
        lo_incl = False
    elif isinstance(ex_lo, (int, float)) and not isinstance(ex_lo, bool) and (lo is None or ex_lo >= lo):
        lo, lo_incl = ex_lo, False
    if ex_hi is True:
        hi_incl = False
    elif isinstance(ex_hi, (int, float)) and not isinstance(ex_hi, bool) and (hi is None or ex_hi <= hi):
        hi, hi_incl = ex_hi, False
    return lo, lo_incl, hi, hi_incl


def _multiple_node(step, path: str) -> tuple:
    """Numbers (either sign, no exponent) that are integer multiples of ``step``."""
    exact = Decimal(repr(step)) if isinstance(step, float) else Decimal(step)
    p = max(0, -exact.as_tuple().exponent)
    m = int(exact * (10 ** p))
    unsigned = ("multiple", m, p)
    zero = parse_regex(r"0(\.0+)?")
    return ra.alt(unsigned, ra.seq(ra.char("-"), ("diff", unsigned, zero)))
