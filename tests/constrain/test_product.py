"""Intersections and differences (constrain/product.py) are exact: over characters (classes
renamed to pseudo-characters, a length bound counted and dropped once it cannot fail) and
over bytes, every drawn string is accepted exactly when Python's ``re`` and the length say so.
A repetition of units counted beside the unit's automaton (``_UnitCounter``) accepts the
language of the repetition's own DFA."""
import json
import random
import re

import numpy as np
import pytest

from tamis.constrain import native, product, regex_ast as ra
from tamis.constrain.automaton import DEAD, LazyDFA, build_nfa
from tamis.constrain.json_formats import EMAIL
from tamis.constrain.json_strings import SAFE_CHAR, SAFE_CHARS, STRING_UNIT, string_schema
from tamis.constrain.regex_parser import parse_regex

# "\t" is no string content without an escape (the patterns' universe). Non-ASCII spaces
# are left out: tamis's \s is ASCII and its \S excludes them (a documented policy).
ALPHABET = ["a", "b", "7", " ", "\t", "@", ".", "-", "\u00e9", "\u4e2d", "\U0001f600", "x"]
WORDS = r"^(?:\S+\s+){0,3}\S+$"


def _matches(regex: str, text: str) -> bool:
    """JSON Schema's pattern semantics (a search) over unescaped string content."""
    return "\t" not in text and re.search(regex, text) is not None


def _accepts(node, text: str) -> bool:
    dfa = LazyDFA(node, allow_empty_language=True)
    state = dfa.walk(dfa.start, text.encode()) if dfa.start != DEAD else DEAD
    return dfa.is_accepting(state)


def _strings(rng: random.Random, count: int, longest: int) -> list[str]:
    return [''.join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest)))
            for _ in range(count)]


def _pattern(regex: str):
    return parse_regex(regex, universe=SAFE_CHARS, anchored=False)


@pytest.mark.parametrize("regex, lo, hi", [(WORDS, 0, 9), (WORDS, 3, 12), (r"^[a-z7]+(@[a-z]+)?$", 2, 6),
                                           (r"\S\s", 1, 4)])
def test_pattern_within_length_bounds(regex, lo, hi, product_alphabet):
    rng = random.Random(f"{regex} {lo} {hi}")
    node = ("and", _pattern(regex), ra.rep(SAFE_CHAR, lo, hi))
    dfa = LazyDFA(node, allow_empty_language=True)
    for text in _strings(rng, 400, hi + 3):
        expected = _matches(regex, text) and lo <= len(text) <= hi
        state = dfa.walk(dfa.start, text.encode())
        assert dfa.is_accepting(state) == expected, (regex, text)


@pytest.fixture(params=["characters", "bytes"])
def product_alphabet(request, monkeypatch):
    """The product over character classes, or (no class allowed) byte by byte."""
    if request.param == "bytes":
        monkeypatch.setattr(product, "MAX_CLASSES", 0)
    return request.param


@pytest.mark.parametrize("a, b", [(WORDS, r"^[^ ]*$"), (r"^[a-z\u00e9 ]*$", r"^a"), (r"\S", r"^[\u4e00-\u9fff]+$")])
def test_difference_and_intersection_of_patterns(a, b, product_alphabet):
    rng = random.Random(7)
    both = ("and", _pattern(a), _pattern(b))
    only_a = ("diff", _pattern(a), _pattern(b))
    for text in _strings(rng, 300, 6):
        in_a, in_b = _matches(a, text), _matches(b, text)
        assert _accepts(both, text) == (in_a and in_b), (a, b, text)
        assert _accepts(only_a, text) == (in_a and not in_b), (a, b, text)


def test_words_within_256_characters_stay_small():
    """~20,000 character states: the byte product passed the 400,000-state NFA limit."""
    node = ("and", _pattern(r"^(?:\S+\s+){0,49}\S+$"), ra.rep(SAFE_CHAR, 0, 256))
    nfa, _, _ = build_nfa(node)
    assert nfa.num_states < 400_000
    dfa = LazyDFA(node)
    for text, expected in [("w " * 49 + "w", True), ("w " * 50 + "w", False),
                           ("\u4e2d" * 256, True), ("\u4e2d" * 257, False), (" x", False)]:
        assert dfa.is_accepting(dfa.walk(dfa.start, text.encode())) == expected


def test_email_within_length_drops_the_count_in_bounded_tails():
    node = ("and", _pattern(EMAIL), ra.rep(SAFE_CHAR, 0, 60))
    dfa = LazyDFA(node)
    ipv6 = "a@[IPv6:1:2:3:4:5:6:7:8]"
    for text, expected in [(ipv6, True), ("a" * 36 + ipv6, True), ("a" * 37 + ipv6, False),
                           ("b" * 50 + "@c.de", True), ("b" * 55 + "@c.de", True),
                           ("b" * 56 + "@c.de", False), ("b@" + "c" * 58, True), ("b@" + "c" * 59, False)]:
        assert len(text) <= 60 or not expected
        assert dfa.is_accepting(dfa.walk(dfa.start, text.encode())) == expected, text


def test_merged_runs_equal_the_runs_of_both_rows():
    """The product reads a pair's runs off each side's cached runs (``_merged_runs``); the
    reference (``_runs``) reads both rows at once."""
    rng = random.Random(11)
    for _ in range(500):
        width = rng.randint(1, 40)
        rows = [np.array([rng.choice([DEAD, DEAD, 0, 1, 2]) for _ in range(width)], dtype=np.int32)
                for _ in range(2)]
        for diff in (False, True):
            runs = [product._runs_of_row(row) for row in rows]
            assert product._merged_runs(*runs, diff) == list(product._runs(*rows, diff))


def test_a_product_shared_by_two_places_is_built_once(monkeypatch):
    """A grammar's property-name difference recurs (first member, later members): its
    product is built once and copied."""
    built = []
    real = product.build_product
    monkeypatch.setattr(product, "build_product", lambda *args: built.append(args[4]) or real(*args))
    names = ("diff", _pattern(r"^[a-z]{1,6}$"), _pattern(r"^(?:id|name|kind)$"))
    node = ra.seq(ra.chars([(0x7B, 0x7B)]), names, ra.chars([(0x2C, 0x2C)]), names)
    dfa = LazyDFA(node)
    assert built == ["diff"]
    for text, expected in [("{ab,cd", True), ("{id,cd", False), ("{ab,kind", False), ("{ab,kinds", True)]:
        assert dfa.is_accepting(dfa.walk(dfa.start, text.encode())) == expected, text


# ---- a repetition of units as a counter --------------------------------------------------

COUNTED_PATTERNS = [WORDS, r"^[a-z7]+(@[a-z]+)?$", r"\S\s", r'^[a"\\]*$', r"^(a|\u00e9|\U0001f600)*x?$",
                    r"b", r'^(?:[a-c]"|\\)+$']
UNITS = [STRING_UNIT, parse_regex("a*b"), parse_regex("[a-c]|\u00e9x"), parse_regex("[^a]")]


def _same_language(x: LazyDFA, y: LazyDFA) -> bool:
    """Whether two DFAs accept the same strings: their reachable pairs of states agree on
    accepting and on which bytes are live."""
    if DEAD in (x.start, y.start):
        return x.start == y.start
    seen = {(x.start, y.start)}
    stack = list(seen)
    while stack:
        p, q = stack.pop()
        if x.is_accepting(p) != y.is_accepting(q):
            return False
        row_x, row_y = x.row(p), y.row(q)
        if ((row_x >= 0) != (row_y >= 0)).any():
            return False
        live = row_x >= 0
        for pair in set(zip(row_x[live].tolist(), row_y[live].tolist())) - seen:
            seen.add(pair)
            stack.append(pair)
    return True


def _built_both_ways(node, monkeypatch) -> tuple[LazyDFA, LazyDFA]:
    """(counted, explicit): ``node``'s DFA with every repetition right of an intersection
    counted when its unit allows, and with none counted."""
    monkeypatch.setattr(product, "MIN_COUNTED_UNITS", 0)
    counted = LazyDFA(node, allow_empty_language=True)
    monkeypatch.setattr(product._UnitCounter, "of", classmethod(lambda cls, node, alphabet: None))
    explicit = LazyDFA(node, allow_empty_language=True)
    monkeypatch.undo()
    return counted, explicit


def _bounds(rng: random.Random) -> tuple[int, int | None]:
    lo = rng.randint(0, 40)
    return lo, rng.choice([None, rng.randint(lo, 40)])


@pytest.mark.parametrize("seed", range(12))
def test_counted_string_lengths_accept_the_explicit_language(seed, product_alphabet, monkeypatch):
    """minLength / maxLength beside a pattern count units of escaped content (a character or
    an escape sequence)."""
    rng = random.Random(seed)
    regex, (lo, hi) = rng.choice(COUNTED_PATTERNS), _bounds(rng)
    schema = {"type": "string", "pattern": regex, "minLength": lo}
    if hi is not None:
        schema["maxLength"] = hi
    counted, explicit = _built_both_ways(string_schema(schema, "#"), monkeypatch)
    assert _same_language(counted, explicit), (regex, lo, hi)
    for text in _strings(rng, 100, 45):
        expected = _matches(regex, text) and lo <= len(text) <= (hi if hi is not None else 10 ** 9)
        encoded = json.dumps(text, ensure_ascii=False).encode()
        assert counted.is_accepting(counted.walk(counted.start, encoded)) == expected, \
            (regex, lo, hi, text)


@pytest.mark.parametrize("seed", range(12))
def test_counted_units_accept_the_explicit_language(seed, product_alphabet, monkeypatch):
    """Units of several states: escape sequences (surrogate pairs), a unit whose start
    recurs inside it (``a*b``), units of several characters."""
    rng = random.Random(seed)
    unit, (lo, hi) = rng.choice(UNITS), _bounds(rng)
    left = rng.choice([ra.rep(STRING_UNIT, 0, None), _pattern(rng.choice(COUNTED_PATTERNS)),
                       parse_regex(r"(a|b|\u00e9x|\\u00e9|\\ud83d\\ude00|\\uD83D\\uDE00)*")])
    counted, explicit = _built_both_ways(("and", left, ra.rep(unit, lo, hi)), monkeypatch)
    assert _same_language(counted, explicit), (unit, lo, hi)


def test_units_that_begin_others_or_may_be_empty_are_not_counted():
    assert product._UnitCounter.of(ra.rep(parse_regex("a|ab"), 0, 100), 256) is None
    assert product._UnitCounter.of(ra.rep(parse_regex("a?"), 0, 100), 256) is None
    assert product._UnitCounter.of(ra.rep(parse_regex("a"), 0, 5), 256) is None       # small
    assert product._UnitCounter.of(ra.rep(parse_regex("ab|c"), 0, 100), 256) is not None


@pytest.mark.parametrize("use_core", [True, False])
def test_a_pattern_within_min_length_10000(use_core, monkeypatch):
    """maskbench's Handwritten/string1.json: its length is counted, not a 10,001-state DFA."""
    if use_core:
        monkeypatch.setattr(native, "CORE", native.load_extension())
    else:
        monkeypatch.setattr(native, "CORE", None)
    schema = {"type": "string", "pattern": "^([a-z][0-9])+$", "minLength": 10000}
    dfa = LazyDFA(string_schema(schema, "#"))
    for text, expected in [("a1" * 5000, True), ("z9" * 6000, True), ("a1" * 4999, False),
                           ("a1" * 4999 + "a", False), ("a1" * 5000 + "a", False),
                           ("a" * 10000, False), ('a"' * 5000, False), ("", False)]:
        assert dfa.is_accepting(dfa.walk(dfa.start, json.dumps(text).encode())) == expected
