"""GBNF (llama.cpp's grammar format, ``root ::= ...``) -> rules of regex ASTs.

Supported, following llama.cpp's GBNF guide: ``name ::= alternatives`` (names of letters,
digits, ``-`` and ``_``), string literals with ``\\n \\r \\t \\\\ \\" \\xXX \\uXXXX \\UXXXXXXXX``
escapes, character classes ``[...]`` with ranges and ``^``, ``.`` (any character), groups,
``|``, ``* + ?``, ``{m}`` ``{m,}`` ``{m,n}``, ``#`` comments; the start rule is ``root``.
Token references (``<[id]>``, ``<think>``) are refused with an error naming them.
"""
from __future__ import annotations

import re

from . import regex_ast as ra
from .errors import GrammarError

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_SIMPLE_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45,
                   "/": 47, "0": 0, "f": 12, "v": 11, "a": 7, "b": 8, "'": 39, "^": 94}


def is_gbnf(text: str) -> bool:
    """vLLM's rule: a grammar with a ``::=`` line is GBNF/EBNF, otherwise Lark."""
    return any("::=" in line for line in text.splitlines())


def parse_gbnf(text: str) -> tuple[dict, str]:
    parser = _GbnfParser(text)
    rules = parser.parse()
    if "root" not in rules:
        raise GrammarError("GBNF grammar has no 'root' rule (the start symbol)")
    return rules, "root"


class _GbnfParser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def parse(self) -> dict:
        rules: dict[str, tuple] = {}
        self._skip()
        while self.pos < len(self.text):
            name = self._name()
            self._skip()
            if not self.text.startswith("::=", self.pos):
                self._fail(f"expected '::=' after rule name {name!r}")
            self.pos += 3
            body = self._alternatives(top=True)
            if name in rules:
                rules[name] = ra.alt(rules[name], body)
            else:
                rules[name] = body
            self._skip()
        if not rules:
            raise GrammarError("the GBNF grammar is empty")
        return rules

    def _alternatives(self, top: bool) -> tuple:
        branches = [self._sequence(top)]
        while self._peek() == "|":
            self.pos += 1
            branches.append(self._sequence(top))
        return ra.alt(*branches)

    def _sequence(self, top: bool) -> tuple:
        items = []
        while True:
            self._skip()
            c = self._peek()
            if c is None or c in "|)":
                break
            if top and self._at_rule_start():
                break
            items.append(self._postfix(self._atom()))
        return ra.seq(*items)

    def _at_rule_start(self) -> bool:
        m = _NAME.match(self.text, self.pos)
        if not m:
            return False
        rest = self.text[m.end():]
        return rest.lstrip(" \t").startswith("::=")

    def _postfix(self, atom) -> tuple:
        while True:
            c = self._peek()
            if c == "*":
                atom, self.pos = ra.rep(atom, 0, None), self.pos + 1
            elif c == "+":
                atom, self.pos = ra.rep(atom, 1, None), self.pos + 1
            elif c == "?":
                atom, self.pos = ra.rep(atom, 0, 1), self.pos + 1
            elif c == "{":
                m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.text, self.pos)
                if not m:
                    self._fail("bad repetition braces")
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    self._fail("repetition max below min")
                atom, self.pos = ra.rep(atom, lo, hi), m.end()
            else:
                return atom

    def _atom(self) -> tuple:
        c = self.text[self.pos]
        if c == '"':
            return self._literal()
        if c == "[":
            return self._class()
        if c == ".":
            self.pos += 1
            return ra.chars(((0, ra.MAX_CODE_POINT),))
        if c == "(":
            self.pos += 1
            inner = self._alternatives(top=False)
            self._skip()
            if self._peek() != ")":
                self._fail("missing ')'")
            self.pos += 1
            return inner
        if c == "<" or c == "!":
            self._fail("token references (<...>) are not supported by tamis")
        name = self._name()
        return ("rule", name)

    def _literal(self) -> tuple:
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(self.text):
                self._fail("unterminated string literal")
            c = self.text[self.pos]
            if c == '"':
                self.pos += 1
                break
            if c == "\\":
                out.append(self._escape())
            else:
                out.append(ord(c))
                self.pos += 1
        return ra.seq(*(ra.chars(((cp, cp),)) for cp in out))

    def _class(self) -> tuple:
        start = self.pos
        self.pos += 1
        negate = False
        if self._raw() == "^":
            negate, self.pos = True, self.pos + 1
        ranges = []
        while True:
            if self.pos >= len(self.text):
                self._fail("unterminated character class", start)
            c = self.text[self.pos]
            if c == "]":
                self.pos += 1
                break
            lo = self._class_char()
            hi = lo
            if self._raw() == "-" and self.text[self.pos + 1:self.pos + 2] not in ("]", ""):
                self.pos += 1
                hi = self._class_char()
                if hi < lo:
                    self._fail("character range end before start", start)
            ranges.append((lo, hi))
        ranges = ra.normalize_ranges(ranges)
        return ra.chars(ra.negate_ranges(ranges) if negate else ranges)

    def _class_char(self) -> int:
        c = self.text[self.pos]
        if c == "\\":
            return self._escape()
        self.pos += 1
        return ord(c)

    def _escape(self) -> int:
        self.pos += 1
        c = self.text[self.pos:self.pos + 1]
        widths = {"x": 2, "u": 4, "U": 8}
        if c in widths:
            digits = self.text[self.pos + 1:self.pos + 1 + widths[c]]
            if len(digits) != widths[c] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                self._fail(f"bad \\{c} escape")
            self.pos += 1 + widths[c]
            return int(digits, 16)
        if c in _SIMPLE_ESCAPES:
            self.pos += 1
            return _SIMPLE_ESCAPES[c]
        self._fail(f"unknown escape \\{c}")

    def _name(self) -> str:
        m = _NAME.match(self.text, self.pos)
        if not m:
            self._fail("expected a rule name")
        self.pos = m.end()
        return m.group(0)

    def _skip(self) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end + 1
            else:
                break

    def _raw(self):
        return self.text[self.pos] if self.pos < len(self.text) else None

    def _peek(self):
        self._skip()
        return self.text[self.pos] if self.pos < len(self.text) else None

    def _fail(self, message: str, at: int | None = None):
        at = self.pos if at is None else at
        line = self.text.count("\n", 0, at) + 1
        raise GrammarError(f"invalid GBNF grammar: {message} (line {line})")
