"""first_bytes(node) must contain every byte the automaton can start with (exact on plain
regexes, a superset on products), so skipping a terminal on it never drops a token."""
import numpy as np
import pytest

from tamis.constrain import regex_ast as ra
from tamis.constrain.automaton import LazyDFA
from tamis.constrain.first_bytes import first_bytes
from tamis.constrain.regex_parser import parse_regex

PLAIN = [r"[a-z]+", r"(ab)?c*d", r"x{0,3}(é|€)", r"(\r?\n)?[ \t]{0,20}", r'"([^"\\]|\\.)*"',
         r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r"(|a)(|b)z", r"[\x00-\x7f\u0400-\u04ff]"]


@pytest.mark.parametrize("pattern", PLAIN)
def test_first_bytes_exact_on_plain_regexes(pattern):
    node = parse_regex(pattern)
    live = LazyDFA(node).row(LazyDFA(node).start) >= 0
    assert (first_bytes(node) == live).all()


@pytest.mark.parametrize("a,b", [(r"[a-f]+x", r"[c-z]+x"), (r"[0-9]{2}", r"1[0-9]")])
def test_first_bytes_superset_on_products(a, b):
    for kind in ("and", "diff"):
        node = (kind, parse_regex(a), parse_regex(b))
        dfa = LazyDFA(node, allow_empty_language=True)
        live = dfa.row(dfa.start) >= 0 if dfa.start >= 0 else np.zeros(256, bool)
        assert not (live & ~first_bytes(node)).any()
        assert first_bytes(ra.seq(ra.rep(node, 0, 1), ra.literal("q")))[ord("q")]
