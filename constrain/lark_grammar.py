"""Lark grammar text -> rules of regex ASTs, using the ``lark`` package to parse and expand
the grammar (EBNF operators, templates, ``%import``), then converting each terminal pattern
with tamis's regex parser.

Semantics are those of Lark's Earley parser with a dynamic lexer: any split of the text into
terminals that the grammar allows is accepted. ``%ignore`` terminals may appear between
any two lexemes. The start rule is ``start``.
"""
from __future__ import annotations

from . import regex_ast as ra
from .errors import ConstraintError, GrammarError
from .regex_parser import parse_regex

# Lark's common.lark writes these with a look-behind; the same languages without one:
_KNOWN_TERMINALS = {
    "ESCAPED_STRING": r'"([^"\\\n]|\\[^\n])*"',
    "_STRING_ESC_INNER": r'([^"\\\n]|\\[^\n])*',
}
# ... and where another terminal uses ESCAPED_STRING, Lark pastes its pattern in: the
# string body with the look-behind, replaced by the same language without it.
_ESC_INNER_LOOKBEHIND = r'.*?(?<!\\)(\\\\)*?'


def parse_lark(text: str) -> tuple[dict, str, list]:
    try:
        from lark import Lark
        from lark.exceptions import LarkError
    except ImportError as exc:  # pragma: no cover - lark is a dependency
        raise GrammarError("Lark grammars need the 'lark' package") from exc
    try:
        parser = Lark(text, parser="earley", lexer="dynamic", start="start", keep_all_tokens=True)
    except LarkError as exc:
        raise GrammarError(f"Failed to convert the grammar from Lark: {exc}") from None
    except Exception as exc:  # lark raises plain errors for some malformed inputs
        raise GrammarError(f"Failed to convert the grammar from Lark: {exc}") from None
    terminals = {}
    for term in parser.terminals:
        terminals[term.name] = _terminal_node(term)
    rules: dict[str, tuple] = {}
    for rule in parser.rules:
        symbols = []
        for symbol in rule.expansion:
            if symbol.is_term:
                if symbol.name not in terminals:
                    raise GrammarError(f"terminal {symbol.name} is declared but never defined")
                symbols.append(terminals[symbol.name])
            else:
                symbols.append(("rule", symbol.name))
        name = rule.origin.name
        name = getattr(name, "value", name)
        body = ra.seq(*symbols)
        rules[name] = ra.alt(rules[name], body) if name in rules else body
    ignore = [terminals[name] for name in parser.ignore_tokens if name in terminals]
    if "start" not in rules:
        raise GrammarError("the Lark grammar has no 'start' rule")
    return rules, "start", ignore


def _terminal_node(term) -> tuple:
    pattern = term.pattern
    flags = set(getattr(pattern, "flags", ()) or ())
    if term.name in _KNOWN_TERMINALS:
        return parse_regex(_KNOWN_TERMINALS[term.name])
    unsupported = flags - {"i", "s", "u"}
    if unsupported:
        raise GrammarError(f"terminal {term.name}: regex flags {sorted(unsupported)} are not supported")
    if pattern.type == "str":
        return _literal(pattern.value, "i" in flags)
    value = pattern.value.replace(_ESC_INNER_LOOKBEHIND, _KNOWN_TERMINALS["_STRING_ESC_INNER"])
    try:
        return parse_regex(value, ignorecase="i" in flags, dotall="s" in flags)
    except ConstraintError as exc:
        raise GrammarError(f"terminal {term.name}: {exc}") from None


def _literal(text: str, ignorecase: bool) -> tuple:
    if not ignorecase:
        return ra.literal(text) if text else ra.EMPTY
    parts = []
    for c in text:
        variants = {ord(c), ord(c.lower()[:1] or c), ord(c.upper()[:1] or c)}
        parts.append(ra.chars(tuple((v, v) for v in variants)))
    return ra.seq(*parts)
