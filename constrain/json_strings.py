"""JSON strings: the string-content alphabet, string schemas (``minLength``/``maxLength``,
``pattern``, ``format`` through ``json_formats``), literal strings and the keys an object's
extra members may use.

Policy: a string constrained by ``pattern`` or ``format`` is written without optional escape
sequences (a pattern's '"' and '\\' take the escapes JSON requires; control characters are
refused); ``maxLength`` above ``MAX_STRING_LENGTH`` is enforced as ``MAX_STRING_LENGTH``
(sound: outputs still satisfy the schema; longer valid values are refused)."""
from __future__ import annotations

import json
from functools import lru_cache

from . import regex_ast as ra
from .errors import ConstraintError, SchemaError
from .json_formats import FORMAT_MAX_LENGTH, format_node, is_annotation_only
from .json_keywords import nonneg_int
from .regex_parser import parse_regex

# String content characters that need no escape: everything but '"', '\' and controls.
SAFE_CHARS = ra.normalize_ranges(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)))
SAFE_CHAR = ("chars", SAFE_CHARS)
# What a ``pattern`` may produce: the safe characters, '"' and '\\' (written escaped).
PATTERN_CHARS = ra.normalize_ranges(SAFE_CHARS + ((0x22, 0x22), (0x5C, 0x5C)))
# A \u escape names one code point: a surrogate only as a high-low pair (one character for
# minLength/maxLength, as JSON Schema counts code points); a lone surrogate is refused, since
# the text it decodes to is not valid Unicode (pydantic, for one, rejects it).
ESCAPE = parse_regex(r'\\(["\\/bfnrt]|u([0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}'
                     r'|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))')
STRING_UNIT = ra.alt(SAFE_CHAR, ESCAPE)
QUOTE = ra.char('"')
ANY_STRING = ra.seq(QUOTE, ra.rep(STRING_UNIT, 0, None), QUOTE)
# Unrolling maxLength 4096 would cost thousands of automaton states per field.
MAX_STRING_LENGTH = 256


def string_schema(schema: dict, path: str) -> tuple:
    """The JSON text of a string meeting ``schema``'s string keywords."""
    lo = nonneg_int(schema, "minLength", path, 0)
    hi = nonneg_int(schema, "maxLength", path, None)
    if hi is not None and hi > MAX_STRING_LENGTH and lo <= MAX_STRING_LENGTH:
        hi = MAX_STRING_LENGTH
    patterns = list(schema.get("_patterns", []))
    if "pattern" in schema:
        patterns.append(schema["pattern"])
    content = None
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise SchemaError("pattern must be a string", f"{path}/pattern")
        try:
            node = parse_regex(pattern, universe=PATTERN_CHARS, anchored=False)
        except ConstraintError as exc:
            raise SchemaError(f"unsupported pattern: {exc}", f"{path}/pattern") from None
        content = node if content is None else ("and", content, node)
    fmt = schema.get("format")
    node = None
    if isinstance(fmt, str) and not is_annotation_only(fmt):
        node = format_node(fmt, SAFE_CHARS)
        if node is None:
            raise SchemaError(f"string format {fmt!r} is not supported by tamis", f"{path}/format")
    if node is not None:            # formats outside the specification are annotations
        if fmt in FORMAT_MAX_LENGTH:
            node = ("and", node, ra.rep(SAFE_CHAR, 0, FORMAT_MAX_LENGTH[fmt]))
        content = node if content is None else ("and", content, node)
    if content is None:
        return ra.seq(QUOTE, ra.rep(STRING_UNIT, lo, hi), QUOTE)
    if lo or hi is not None:
        content = ("and", content, ra.rep(("chars", PATTERN_CHARS), lo, hi))
    return ra.seq(QUOTE, escaped(content) if patterns else content, QUOTE)


def escaped(node, memo: dict | None = None) -> tuple:
    """String content (characters of ``PATTERN_CHARS``) as JSON text: '"' and '\\' written as
    the escapes JSON requires, every other character as itself. The map is one-to-one, so
    it keeps intersections and differences (``and``/``diff`` nodes) exact."""
    memo = {} if memo is None else memo
    found = memo.get(id(node))
    if found is not None:
        return found[0]
    kind = node[0]
    if kind == "chars":
        out = ra.alt(("chars", ra.intersect_ranges(node[1], SAFE_CHARS)),
                     *(ra.literal(json.dumps(chr(c))[1:-1]) for c in (0x22, 0x5C)
                       if any(lo <= c <= hi for lo, hi in node[1])))
    elif kind in ("seq", "alt"):
        out = (kind, tuple(escaped(child, memo) for child in node[1]))
    elif kind == "rep":
        out = ("rep", escaped(node[1], memo), node[2], node[3])
    elif kind in ("and", "diff"):
        out = (kind, escaped(node[1], memo), escaped(node[2], memo))
    else:
        raise ValueError(f"escaped() of a {kind!r} node")
    memo[id(node)] = (out, node)
    return out


def json_string_literal(text: str) -> tuple:
    return ra.literal(json.dumps(text, ensure_ascii=False))


def string_not_in(names: list, path: str) -> tuple:
    """String content (escapes allowed) that does not decode to any of ``names``: neither
    their plain JSON form nor one spelled with escapes (``\\u0061`` is ``a``)."""
    encoded = tuple(json.dumps(n, ensure_ascii=False)[1:-1] for n in names)
    if any("\\" in e for e in encoded):
        raise SchemaError("additional properties next to property names that need JSON escapes "
                          "are not supported", path)
    return _content_not_in(tuple(names))


@lru_cache(maxsize=256)
def _content_not_in(names: tuple) -> tuple:
    """Cached: the combinators compile the same object's extras once per branch they merge.
    A difference (``product``), not a trie spelled out with a free tail at every node: the
    product keeps one state per (trie node, string state) pair it reaches, where the spelled
    trie copied the tail (escapes, multi-byte characters: ~50 states) at every node."""
    any_content = ra.rep(STRING_UNIT, 0, None)
    if not names:
        return any_content
    return ("diff", any_content, ra.alt(*(ra.seq(*map(_spellings, name)) for name in names)))


@lru_cache(maxsize=4096)
def _spellings(c: str) -> tuple:
    """Every JSON spelling of the character ``c`` in string content: itself, ``\\uXXXX`` in
    either case (a surrogate pair above U+FFFF), and ``\\/`` for ``/``."""
    code = ord(c)
    units = [code] if code < 0x10000 else [0xD800 + ((code - 0x10000) >> 10),
                                           0xDC00 + ((code - 0x10000) & 0x3FF)]
    escaped = ra.seq(*(ra.seq(ra.literal("\\u"), *(_hex_digit(d) for d in f"{unit:04x}"))
                       for unit in units))
    spellings = [ra.char(c), escaped] + ([ra.literal("\\/")] if c == "/" else [])
    return ra.alt(*spellings)


def _hex_digit(d: str) -> tuple:
    return ra.chars([(ord(d), ord(d)), (ord(d.upper()), ord(d.upper()))])
