"""JSON strings: the string-content alphabet, string schemas (``minLength``/``maxLength``,
``pattern``, ``format`` through ``json_formats``), literal strings and the keys an object's
extra members may use.

Policy: a string constrained by ``pattern`` or ``format`` is written without escape
sequences; ``maxLength`` above ``MAX_STRING_LENGTH`` is enforced as ``MAX_STRING_LENGTH``
(sound: outputs still satisfy the schema; longer valid values are refused)."""
from __future__ import annotations

import json

from . import regex_ast as ra
from .errors import ConstraintError, SchemaError
from .json_formats import FORMAT_MAX_LENGTH, format_node, is_annotation_only
from .json_keywords import nonneg_int
from .regex_parser import parse_regex

# String content characters that need no escape: everything but '"', '\' and controls.
SAFE_CHARS = ra.normalize_ranges(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)))
SAFE_CHAR = ("chars", SAFE_CHARS)
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
            node = parse_regex(pattern, universe=SAFE_CHARS, anchored=False)
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
        content = ("and", content, ra.rep(SAFE_CHAR, lo, hi))
    return ra.seq(QUOTE, content, QUOTE)


def json_string_literal(text: str) -> tuple:
    return ra.literal(json.dumps(text, ensure_ascii=False))


def string_not_in(names: list, path: str) -> tuple:
    """String content (escapes allowed) that is not the JSON form of any of ``names``."""
    any_content = ra.rep(STRING_UNIT, 0, None)
    encoded = [json.dumps(n, ensure_ascii=False)[1:-1] for n in names]
    if not encoded:
        return any_content
    if any("\\" in e for e in encoded):
        raise SchemaError("additional properties next to property names that need JSON escapes "
                          "are not supported", path)
    trie: dict = {}
    for e in encoded:
        node = trie
        for c in e:
            node = node.setdefault(c, {})
        node[None] = True

    def build(node) -> tuple:
        used = [(ord(c), ord(c)) for c in node if c is not None]
        others = ("chars", ra.intersect_ranges(ra.negate_ranges(used), SAFE_CHARS))
        branches = [ra.seq(ra.alt(others, ESCAPE), any_content)]
        branches += [ra.seq(ra.char(c), build(child)) for c, child in node.items() if c is not None]
        if None not in node:
            branches.append(ra.EMPTY)
        return ra.alt(*branches)
    return build(trie)
