"""constrain/regex_anchors.py: ``^`` and ``$`` anywhere in a pattern, and the parser's
top-level look-aheads. Random patterns over a small alphabet, with anchors inside groups,
alternations and repetitions, or look-aheads before, between and after other items, are
parsed with JSON-schema search semantics (and full-match semantics) and compared with
Python's ``re.search`` (``re.fullmatch``) on every string of up to four characters (no
newline, where Python's ``$`` and ECMAScript's differ)."""
import itertools
import random
import re

import pytest

from tamis.constrain import regex_ast as ra
from tamis.constrain.errors import ConstraintError
from tamis.constrain.regex_parser import parse_regex

ALPHABET = "ab,"
STRINGS = ["".join(t) for n in range(5) for t in itertools.product(ALPHABET, repeat=n)]


def ends(node, text: str, start: int) -> set:
    """End positions of the matches of ``node`` from ``start`` (a plain reference matcher)."""
    kind = node[0]
    if kind == "chars":
        if start < len(text) and any(lo <= ord(text[start]) <= hi for lo, hi in node[1]):
            return {start + 1}
        return set()
    if kind == "seq":
        positions = {start}
        for child in node[1]:
            positions = {e for p in positions for e in ends(child, text, p)}
        return positions
    if kind == "alt":
        return {e for child in node[1] for e in ends(child, text, start)}
    if kind in ("and", "diff"):   # look-aheads: both operands read the same span
        left, right = ends(node[1], text, start), ends(node[2], text, start)
        return left & right if kind == "and" else left - right
    assert kind == "rep", kind
    _, inner, lo, hi = node
    out, frontier, count = set(), {start}, 0
    while frontier and (hi is None or count <= hi):
        if count >= lo:
            out |= frontier
        if hi is not None and count == hi:
            break
        step = {e for p in frontier for e in ends(inner, text, p)}
        frontier = step - frontier if count >= lo else step
        count += 1
        if count > len(text) + lo + 1:
            break
    return out


def matches(node, text: str) -> bool:
    return len(text) in ends(node, text, 0)


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    pick = rng.random()
    if depth > 2 or pick < 0.3:
        return rng.choice(["a", "b", ",", "[^,]", "^", "$", "a*", "."])
    if pick < 0.55:
        return "".join(random_pattern(rng, depth + 1) for _ in range(rng.randint(2, 3)))
    if pick < 0.8:
        return "(" + "|".join(random_pattern(rng, depth + 1) for _ in range(2)) + ")"
    return "(" + random_pattern(rng, depth + 1) + ")" + rng.choice(["*", "+", "?", "{2}", "{0,2}"])


PATTERNS = ["^([^,]|$)", "/^[0-9]{4}$/", "(a|^b)c", "^(\\/?((\\.{2})|([a-z0-9\\-]*))($|\\/))*$",
            "a$|^b", "(^|,)a($|,)", "(^a)*b", "(a$)+", "x^", "$a"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_anchors_inside_patterns_match_like_python(pattern):
    node = parse_regex(pattern, anchored=False)
    for text in STRINGS + ["ab,", "0000", "/1234/", "a/..", "b/c", "xa", "a", ""]:
        assert matches(node, text) == (re.search(pattern, text) is not None), (pattern, text)


def test_random_patterns_with_anchors_match_like_python():
    rng = random.Random(5)
    checked = 0
    while checked < 80:
        pattern = random_pattern(rng)
        if "^" not in pattern and "$" not in pattern:
            continue
        try:
            re.compile(pattern)
        except re.error:
            continue
        node = parse_regex(pattern, anchored=False)
        wrong = [t for t in STRINGS if matches(node, t) != (re.search(pattern, t) is not None)]
        assert not wrong, (pattern, wrong[:5])
        checked += 1


def test_no_marker_is_left():
    node = parse_regex("(a|^b)*($|c)", anchored=False)
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        assert n[0] not in ("bos", "eos")
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(ra.children(n))


LOOKAHEADS = ["^(?!ab).*", "^(?!^a|b,)", "(?=a)a*b", "^(?=.{2,3}$)[ab]+$", "a(?!b)", "(?!a)",
              "^(?!a)(?!b).*$", "(?=a,)(?!ab)..", "^(?=(a|b)$)", "^a(?=b|,$)", "(?=a)|b,",
              "(a(?=b))", "^(?=a)(?=.b)",
              # look-aheads inside a repeated group that ends the string ("tempered" tokens)
              "^((?!ab).)*$", "^((?!a)(?!,b).)*$", "^x(?:(?!b,).)+$", "((?!a).){1,3}$",
              "^((?!a|).)*$", "^((?!b$).)*$"]


@pytest.mark.parametrize("pattern", LOOKAHEADS)
def test_lookaheads_match_like_python(pattern):
    for anchored, python in ((False, re.search), (True, re.fullmatch)):
        node = parse_regex(pattern, anchored=anchored)
        wrong = [t for t in STRINGS if matches(node, t) != (python(pattern, t) is not None)]
        assert not wrong, (pattern, anchored, wrong[:5])


def _plain(rng: random.Random) -> str:
    while True:
        pattern = random_pattern(rng, depth=1)
        if "^" not in pattern and "$" not in pattern:
            return pattern


def test_random_lookaheads_match_like_python():
    rng = random.Random(7)
    for _ in range(80):
        body = rng.choice(["", "^"]) + _plain(rng) + rng.choice(["", "$"])
        if body.startswith("^") and rng.random() < 0.5:
            body = body[1:]
        before = rng.choice(["", "^", "^" + _plain(rng), _plain(rng)])
        if body.startswith("^"):
            before = "^"
        pattern = before + rng.choice(["(?=", "(?!"]) + body + ")" + _plain(rng) + rng.choice(["", "$"])
        for anchored, python in ((False, re.search), (True, re.fullmatch)):
            node = parse_regex(pattern, anchored=anchored)
            wrong = [t for t in STRINGS if matches(node, t) != (python(pattern, t) is not None)]
            assert not wrong, (pattern, anchored, wrong[:5])


@pytest.mark.parametrize("pattern, message", [
    ("(a(?=b))c", "look-ahead inside a group"),
    ("((^a)|b)(?!,)", "'^' or '$' inside a pattern with"), ("(?=a)*", "repeated look-ahead"),
    ("a(?=^b)", "'^' inside a look-ahead"), ("(?=a)b$c", "'^' or '$' inside a pattern with"),
    ("(?<!a)b", "look-behind"), ("^((?!a).)*b$", "only at the end of a pattern"),
    ("^((?!a).)*", "only at the end of a pattern"), ("^((?!a)ab)*$", "must end in one character")])
def test_lookaheads_that_are_refused(pattern, message):
    with pytest.raises(ConstraintError, match=re.escape(message)):
        parse_regex(pattern, anchored=False)
