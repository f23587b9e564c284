"""Code-point ranges -> sequences of byte ranges matching exactly their UTF-8 encodings.

``utf8_sequences(lo, hi)`` returns a tuple of alternatives, each a tuple of (byte_lo, byte_hi)
pairs, one pair per byte, the same decomposition Rust's ``regex-syntax`` uses: split the range
where the encoded length changes, then where the continuation bytes stop covering their full
0x80..0xBF span, until every piece is a product of byte ranges.
"""
from __future__ import annotations

from functools import lru_cache

_LENGTH_LIMITS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF))


def utf8_sequences(lo: int, hi: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Cached (the same classes recur in every JSON string): a tuple of alternatives."""
    return _sequences(lo, hi)


@lru_cache(maxsize=4096)
def _sequences(lo: int, hi: int) -> tuple:
    out: list[list[tuple[int, int]]] = []
    for min_cp, max_cp in _LENGTH_LIMITS:
        a, b = max(lo, min_cp), min(hi, max_cp)
        if a <= b:
            _split_same_length(a, b, out)
    return tuple(tuple(seq) for seq in out)


def _split_same_length(lo: int, hi: int, out: list) -> None:
    if lo <= 0x7F:
        out.append([(lo, hi)])
        return
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask != 0:
                _split_same_length(lo, (lo | mask), out)
                _split_same_length((lo | mask) + 1, hi, out)
                return
            if hi & mask != mask:
                _split_same_length(lo, (hi & ~mask) - 1, out)
                _split_same_length(hi & ~mask, hi, out)
                return
    a, b = _encode(lo), _encode(hi)
    out.append([(x, y) for x, y in zip(a, b)])


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")
