"""Regex text -> ``regex_ast`` node. The dialect is the common core of Python ``re`` and
ECMAScript (what JSON-schema ``pattern`` uses):

- literals, escapes ``\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH \\u{H..} \\UHHHHHHHH``, classes ``\\d \\w \\s``
  (ASCII meaning) and their negations, ``.``, ``[...]`` with ranges and negation;
- groups ``(...)``, ``(?:...)``, ``(?P<name>...)``, ``(?<name>...)``; alternation ``|``;
- quantifiers ``* + ? {m} {m,} {m,n}`` with an optional lazy ``?`` (same language);
- ``^`` and ``$`` anywhere (``^([^,]|$)``, ``(a|^b)c``): ``regex_anchors`` removes them;
- look-aheads ``(?=...)`` and ``(?!...)`` in the top-level sequence of a branch
  (``^(?!internal-).*``, ``^(?=.{1,63}$)[a-z.]+$``): what follows the look-ahead, to the
  end of the string, is intersected with (or, negated, less) the strings that begin with
  its body, so the language stays regular and exact; and a repeated group of negative
  look-aheads and one character ending the string (``^((?!--).)*$``): the repeated
  characters less every string with a match of a look-ahead's body at one of them.

Refused with a ``RegexError`` naming the construct (a matcher over a regular language cannot
enforce them): backreferences, look-behind, other look-aheads inside groups, word
boundaries, possessive quantifiers, atomic groups, inline flags other than ``(?i)``/``(?s)``
at the start.

``parse_regex(text, universe=...)``: ``universe`` is the set of code points that ``.`` and
negated classes may produce (JSON string content excludes ``"``, ``\\`` and control characters);
``anchored=False`` gives JSON-schema search semantics (``x`` means ``.*x.*``).
"""
from __future__ import annotations

import re
from functools import lru_cache

from . import regex_ast as ra
from .errors import RegexError
from .regex_anchors import BOS, EOS, drop_anchors, has_anchor

ANY = ((0, ra.MAX_CODE_POINT),)
_LOOKS = ("look", "tempered")     # look-ahead items of a top-level sequence
DIGIT = ((48, 57),)
WORD = ((48, 57), (65, 90), (95, 95), (97, 122))
SPACE = ((9, 13), (32, 32))
MAX_REPEAT = 10_000


@lru_cache(maxsize=None)
def _unicode_class(letter: str) -> tuple:
    """The widest meaning of \\d, \\w or \\s across Python (Unicode) and ECMAScript, so
    that a negated class (\\D, \\W, \\S) excludes everything either dialect excludes.
    Found with Python's own ``re`` over every code point (fast: the scan runs in C)."""
    everything = "".join(map(chr, range(ra.MAX_CODE_POINT + 1)))
    ranges = [(m.start(), m.end() - 1) for m in re.finditer("\\" + letter + "+", everything)]
    if letter == "s":
        ranges.append((0xFEFF, 0xFEFF))     # ECMAScript counts the BOM as whitespace
    return ra.normalize_ranges(ranges)


def parse_regex(text: str, universe=ANY, anchored: bool = True, ignorecase: bool = False,
                dotall: bool = False) -> tuple:
    if not isinstance(text, str):
        raise RegexError(f"regex must be a string, got {type(text).__name__}")
    return _Parser(text, universe, anchored, ignorecase, dotall).parse()


class _Parser:
    def __init__(self, text, universe, anchored, ignorecase, dotall):
        self.text, self.pos = text, 0
        self.universe = ra.normalize_ranges(universe)
        self.anchored, self.ignorecase, self.dotall = anchored, ignorecase, dotall
        # Set for the body of a look-ahead: whether it stands where nothing was consumed.
        self.lookahead_at_start: bool | None = None

    # ---- entry and anchors -------------------------------------------------------------
    def parse(self) -> tuple:
        self._leading_flags()
        branches = []
        while True:
            branches.append(self._top_branch())
            if self.pos >= len(self.text):
                break
            if self.text[self.pos] == "|":
                self.pos += 1
                continue
            self._fail("unbalanced ')'")
        return drop_anchors(ra.alt(*branches))

    def _leading_flags(self):
        while self.text.startswith("(?", self.pos) and self.pos + 2 < len(self.text) \
                and self.text[self.pos + 2] in "is":
            end = self.text.find(")", self.pos)
            flags = self.text[self.pos + 2:end]
            if end < 0 or not set(flags) <= set("is"):
                return
            self.ignorecase |= "i" in flags
            self.dotall |= "s" in flags
            self.pos = end + 1

    def _top_branch(self) -> tuple:
        inner = self._whole_branch_group()
        if inner is not None:   # "(^a$)|b": the group's own branches, with their anchors
            return self._sub_parser(inner, self.lookahead_at_start).parse()
        start_anchor = self._eat("^")
        items = self._sequence(top=True)
        end_anchor = False
        if items and items[-1] == "$":
            items.pop()
            end_anchor = True
        anything = self._anything()
        if self.lookahead_at_start is not None:   # a look-ahead's body: the rest may follow
            if start_anchor and not self.lookahead_at_start:
                self._fail("'^' inside a look-ahead that does not stand at the start of the "
                           "pattern")
            prefix, tail = ra.EMPTY, EMPTY_IF(end_anchor, anything)
            at_start = self.lookahead_at_start
        elif self.anchored:
            prefix, tail, at_start = ra.EMPTY, ra.EMPTY, True
        else:
            prefix, tail = EMPTY_IF(start_anchor, anything), EMPTY_IF(end_anchor, anything)
            at_start = start_anchor
        return ra.seq(prefix, self._with_lookaheads(items, tail, at_start))

    def _with_lookaheads(self, items: list, tail, at_start: bool) -> tuple:
        """``items`` then ``tail``; each look-ahead among the items constrains everything
        after it: ``P (?=A) R`` is P then (R tail and A anything), ``(?!A)`` takes the
        difference instead. ``at_start``: nothing is consumed before the first item."""
        if not any(item[0] in _LOOKS for item in items):
            return ra.seq(*items, tail)
        if any(item[0] not in _LOOKS and has_anchor(item) for item in items) \
                or self.lookahead_at_start is not None and has_anchor(ra.seq(*items)):
            self._fail("'^' or '$' inside a pattern with a look-ahead is supported only at "
                       "its start and end")
        node = tail
        for k in reversed(range(len(items))):
            item = items[k]
            if item[0] == "look":
                _, positive, body = item
                ahead = self._sub_parser(body, at_start and k == 0).parse()
                node = ("and" if positive else "diff", node, ahead)
            elif item[0] == "tempered":
                if k != len(items) - 1 or tail != ra.EMPTY:
                    self._fail("a look-ahead inside a repeated group is supported only at the "
                               "end of a pattern that ends with '$'")
                node = self._tempered(*item[1:])
            else:
                node = ra.seq(item, node)
        return node

    def _tempered(self, repeated, bodies: list) -> tuple:
        """``((?!X1)(?!X2)c)*`` ending the string: the repeated characters, with no match of
        any Xi starting at one of them (each Xi may read on to the end of the string)."""
        aheads = ra.alt(*(self._sub_parser(body, False).parse() for body in bodies))
        if ra.matches_empty(aheads):      # an empty match fails every position
            return ra.EMPTY if ra.matches_empty(repeated) else ra.NOTHING
        return ("diff", repeated, ra.seq(self._anything(), aheads))

    def _tempered_group(self) -> tuple | None:
        """``(?:(?!X)...c)`` with its quantifier at ``pos`` (consumed): ("tempered", the
        repeated character, [X, ...]); None (nothing consumed) for any other group."""
        text, start = self.text, self.pos
        opening = 3 if text.startswith("(?:(?!", start) else 1 if text.startswith("((?!", start) else 0
        close = _closing_paren(text, start) if opening else None
        if close is None:
            return None
        bodies, at = [], start + opening
        while text.startswith("(?!", at):
            end = _closing_paren(text, at)
            if end is None or end > close:
                return None
            bodies.append(text[at + 3:end])
            at = end + 1
        character = _Parser(text[at:close], self.universe, True, self.ignorecase, self.dotall).parse()
        if character[0] != "chars":
            self._fail("a repeated group with look-aheads must end in one character "
                       "(as in ((?!ab).)*)", start)
        self.pos = close + 1
        return ("tempered", self._quantified(character), bodies)

    def _anything(self) -> tuple:
        """Any string of the universe's characters."""
        return ("rep", ra.chars(self.universe), 0, None)

    def _sub_parser(self, text: str, lookahead_at_start: bool | None) -> "_Parser":
        sub = _Parser(text, self.universe, self.anchored, self.ignorecase, self.dotall)
        sub.lookahead_at_start = lookahead_at_start
        return sub

    def _lookahead(self) -> tuple:
        """``(?=...)`` or ``(?!...)`` at ``pos``, consumed: ("look", positive, body text)."""
        start = self.pos
        close = _closing_paren(self.text, start)
        if close is None:
            self._fail("missing ')'", start)
        self.pos = close + 1
        following = self.text[self.pos:self.pos + 1]
        if following and (following in "*+?" or following == "{" and self._brace_quantifier()):
            self._fail("a repeated look-ahead is not supported", start)
        return ("look", self.text[start + 2] == "=", self.text[start + 3:close])

    def _whole_branch_group(self) -> str | None:
        """The inside of a plain or non-capturing group that makes up this whole top-level
        branch (consumed), or None (nothing consumed)."""
        text, start = self.text, self.pos
        if not text.startswith("(", start) or text.startswith("(?", start) \
                and not text.startswith("(?:", start):
            return None
        close = _closing_paren(text, start)
        if close is None or not (close + 1 == len(text) or text[close + 1] == "|"):
            return None
        self.pos = close + 1
        return text[start + (3 if text.startswith("(?:", start) else 1):close]

    # ---- sequences and atoms -----------------------------------------------------------
    def _sequence(self, top=False) -> list:
        items = []
        while self.pos < len(self.text) and self.text[self.pos] not in "|)":
            if self.text[self.pos] == "$":
                self.pos += 1
                if top and (self.pos >= len(self.text) or self.text[self.pos] == "|"):
                    items.append("$")
                    break
                items.append(EOS)          # removed by regex_anchors once the pattern is read
                continue
            if self.text[self.pos] == "^":
                self.pos += 1
                items.append(BOS)
                continue
            if top and self.text.startswith(("(?=", "(?!"), self.pos):
                items.append(self._lookahead())
                continue
            tempered = self._tempered_group() if top else None
            if tempered is not None:
                items.append(tempered)
                continue
            atom = self._atom()
            items.append(self._quantified(atom))
        return items

    def _quantified(self, atom) -> tuple:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "*":
                lo, hi = 0, None
                self.pos += 1
            elif c == "+":
                lo, hi = 1, None
                self.pos += 1
            elif c == "?":
                lo, hi = 0, 1
                self.pos += 1
            elif c == "{" and self._brace_quantifier() is not None:
                lo, hi = self._brace_quantifier(consume=True)
            else:
                break
            if self._eat("?"):
                pass  # lazy: same language
            elif self.pos < len(self.text) and self.text[self.pos] == "+":
                self._fail("possessive quantifiers are not supported")
            atom = ra.rep(atom, lo, hi)
        return atom

    def _brace_quantifier(self, consume=False):
        end = self.text.find("}", self.pos)
        if end < 0:
            return None
        body = self.text[self.pos + 1:end]
        parts = body.split(",")
        if len(parts) > 2 or not parts[0].strip().isdigit() and not (len(parts) == 2 and parts[0] == ""):
            return None
        if len(parts) == 2 and parts[1].strip() and not parts[1].strip().isdigit():
            return None
        lo = int(parts[0]) if parts[0].strip() else 0
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1].strip() else None)
        if max(lo, hi or 0) > MAX_REPEAT:
            self._fail(f"repetition count above {MAX_REPEAT}")
        if hi is not None and hi < lo:
            self._fail(f"bad repetition {{{body}}}: max below min")
        if consume:
            self.pos = end + 1
        return lo, hi

    def _atom(self) -> tuple:
        c = self.text[self.pos]
        if c == "(":
            return self._group()
        if c == "[":
            return self._class()
        if c == ".":
            self.pos += 1
            dot = ANY if self.dotall else ra.negate_ranges(((10, 10),))
            return self._chars(dot)
        if c == "\\":
            return self._escape(in_class=False)
        if c in "*+?":
            self._fail(f"nothing to repeat before '{c}'")
        if c == "{" and self._brace_quantifier() is not None:
            self._fail("nothing to repeat before '{'")
        self.pos += 1
        return self._chars(((ord(c), ord(c)),))

    def _group(self) -> tuple:
        start = self.pos
        self.pos += 1
        saved = (self.ignorecase, self.dotall)
        if self.text.startswith("?", self.pos):
            rest = self.text[self.pos:]
            scoped = re.match(r"\?([imsux]*)(-[imsux]+)?:", rest)
            if scoped and (scoped.group(1) or scoped.group(2)):
                on, off = scoped.group(1), scoped.group(2) or ""
                if set(on + off) - set("is-"):
                    self._fail("inline flags other than i and s are not supported", start)
                self.ignorecase = ("i" in on or self.ignorecase) and "i" not in off
                self.dotall = ("s" in on or self.dotall) and "s" not in off
                self.pos += scoped.end()
            elif rest.startswith("?:"):
                self.pos += 2
            elif rest.startswith("?P<") or (rest.startswith("?<") and rest[2:3] not in ("=", "!")):
                end = self.text.find(">", self.pos)
                if end < 0:
                    self._fail("unterminated group name")
                self.pos = end + 1
            elif rest.startswith(("?=", "?!")):
                self._fail("a look-ahead inside a group is not supported (only in the top-level "
                           "sequence of a pattern); rewrite without (?= or (?!", start)
            elif rest.startswith(("?<=", "?<!")):
                self._fail("look-behind assertions are not supported (a left-to-right matcher "
                           "cannot enforce them); rewrite without (?<= or (?<!", start)
            elif rest.startswith("?>"):
                self._fail("atomic groups are not supported", start)
            elif rest.startswith("?P="):
                self._fail("backreferences are not supported", start)
            else:
                self._fail("unsupported group syntax (inline flags are only allowed at the start)", start)
        branches = [ra.seq(*self._sequence())]
        while self._eat("|"):
            branches.append(ra.seq(*self._sequence()))
        if not self._eat(")"):
            self._fail("missing ')'", start)
        self.ignorecase, self.dotall = saved
        return ra.alt(*branches)

    # ---- escapes and classes -----------------------------------------------------------
    def _escape(self, in_class: bool):
        start = self.pos
        self.pos += 1
        if self.pos >= len(self.text):
            self._fail("pattern ends with a lone backslash", start)
        c = self.text[self.pos]
        self.pos += 1
        classes = {"d": DIGIT, "w": WORD, "s": SPACE}
        if c in classes:
            return self._chars(classes[c]) if not in_class else classes[c]
        if c.lower() in classes:
            negated = ra.intersect_ranges(ra.negate_ranges(_unicode_class(c.lower())), self.universe)
            return self._chars(negated) if not in_class else negated
        if c.isdigit() and c != "0":
            self._fail(f"backreferences (\\{c}) are not supported", start)
        if c == "k" and self.text.startswith("<", self.pos):
            self._fail("backreferences (\\k<name>) are not supported", start)
        if c in "bB" and not in_class:
            self._fail(f"word boundary \\{c} is not supported (it is a look-around)", start)
        if c in "AZzG" and not in_class:
            self._fail(f"anchor \\{c} is not supported", start)
        if c == "p" or c == "P":
            self._fail("Unicode property classes (\\p{...}) are not supported", start)
        cp = self._escape_code_point(c, start)
        return self._chars(((cp, cp),)) if not in_class else ((cp, cp),)

    def _escape_code_point(self, c: str, start: int) -> int:
        simple = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0, "a": 7}
        if c == "b":
            return 8  # inside a class \b is backspace
        if c in simple:
            return simple[c]
        if c == "x":
            return self._hex(2, start)
        if c == "u":
            if self._eat("{"):
                end = self.text.find("}", self.pos)
                value = self.text[self.pos:end]
                self.pos = end + 1
                return int(value, 16)
            return self._hex(4, start)
        if c == "U":
            return self._hex(8, start)
        if c == "c":
            letter = self.text[self.pos]
            self.pos += 1
            return ord(letter) % 32
        if c.isalnum():
            self._fail(f"unknown escape \\{c}", start)
        return ord(c)

    def _hex(self, n: int, start: int) -> int:
        digits = self.text[self.pos:self.pos + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            self._fail(f"bad hex escape, expected {n} hex digits", start)
        self.pos += n
        return int(digits, 16)

    def _class(self) -> tuple:
        start = self.pos
        self.pos += 1
        negate = self._eat("^")
        ranges, first = [], True
        while True:
            if self.pos >= len(self.text):
                self._fail("unterminated character class '['", start)
            c = self.text[self.pos]
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            lo = self._class_atom()
            if isinstance(lo, tuple):
                ranges.extend(lo)
                continue
            if self.text.startswith("-", self.pos) and self.pos + 1 < len(self.text) \
                    and self.text[self.pos + 1] != "]":
                self.pos += 1
                hi = self._class_atom()
                if isinstance(hi, tuple):
                    self._fail("bad character range (a class cannot end a range)", start)
                if hi < lo:
                    self._fail("bad character range (end before start)", start)
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        ranges = self._fold_case(ra.normalize_ranges(ranges))
        if negate:
            ranges = ra.negate_ranges(ranges)
        return ra.chars(ra.intersect_ranges(ra.normalize_ranges(ranges), self.universe))

    def _class_atom(self):
        c = self.text[self.pos]
        if c == "\\":
            got = self._escape(in_class=True)
            if len(got) == 1 and got[0][0] == got[0][1]:
                return got[0][0]
            return got
        if c == "[" and self.text.startswith("[:", self.pos):
            self._fail("POSIX classes [:name:] are not supported")
        self.pos += 1
        return ord(c)

    def _chars(self, ranges) -> tuple:
        ranges = self._fold_case(ra.normalize_ranges(ranges))
        return ra.chars(ra.intersect_ranges(ranges, self.universe))

    def _fold_case(self, ranges) -> tuple:
        if not self.ignorecase:
            return ranges
        extra = []
        for lo, hi in ranges:
            for cp in range(lo, min(hi, 0x24F) + 1):
                ch = chr(cp)
                for other in (ch.lower(), ch.upper()):
                    if len(other) == 1:
                        extra.append((ord(other), ord(other)))
        return ra.normalize_ranges(list(ranges) + extra)

    # ---- helpers -----------------------------------------------------------------------
    def _eat(self, s: str) -> bool:
        if self.text.startswith(s, self.pos):
            self.pos += len(s)
            return True
        return False

    def _fail(self, message: str, at: int | None = None):
        at = self.pos if at is None else at
        raise RegexError(f"invalid regex {self.text!r}: {message} at position {at}")


def EMPTY_IF(condition: bool, node) -> tuple:
    return ra.EMPTY if condition else node


def _closing_paren(text: str, start: int) -> int | None:
    """The index of the ``)`` closing the ``(`` at ``start`` (escapes and classes skipped)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i += 1
            if i < len(text) and text[i] == "^":
                i += 1
            if i < len(text) and text[i] == "]":
                i += 1
            while i < len(text) and text[i] != "]":
                i += 2 if text[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None
