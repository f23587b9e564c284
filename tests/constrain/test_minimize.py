"""A fragment replaced by its minimal DFA (constrain/minimize.py) reads the same strings
from its start to its end; a JSON string's character shrinks by half, and a string of at
most 255 characters is exactly the same language with the minimized character pasted."""
import random

import pytest

from tamis.constrain import automaton
from tamis.constrain import regex_ast as ra
from tamis.constrain.automaton import LazyDFA, NFA
from tamis.constrain.json_strings import STRING_UNIT
from tamis.constrain.minimize import minimal_fragment
from tamis.constrain.regex_parser import parse_regex

REGEXES = [r"(\r?\n)?[ \t]{0,20}", r"(ab|ac)*d?", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r"[\u00e9\u4e2d\U0001f600x]{1,3}",
           r"(a|b)*abb", r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})']
ALPHABET = ["a", "b", "c", "d", "0", "1", "9", ".", "-", " ", "\t", "\n", "\r", "x", "\u00e9", "\u4e2d",
            "\U0001f600", "\\", "u", "F", '"']


def _fragment(node):
    nfa = NFA()
    start = nfa.new_state()
    return nfa, start, automaton._build_node(nfa, node, start)


def _accepts(nfa: NFA, start: int, end: int, text: str) -> bool:
    dfa = LazyDFA.from_nfa(nfa, end)
    state = dfa.walk(dfa.start_at(start), text.encode())
    return dfa.is_accepting(state)


@pytest.mark.parametrize("regex", REGEXES + ["STRING_UNIT"])
def test_minimal_fragment_reads_the_same_strings(regex):
    node = STRING_UNIT if regex == "STRING_UNIT" else parse_regex(regex)
    nfa, start, end = _fragment(node)
    minimal = minimal_fragment(nfa, start, end)
    assert minimal is not None
    small, small_end = minimal          # may be larger (a start copy, an end): then unused
    if regex == "STRING_UNIT":
        assert small.num_states < 0.6 * nfa.num_states
    assert 0 not in small.edge_to and 0 not in small.eps_to         # start never re-entered
    assert not small.edges_of(small_end) and not small.eps_of(small_end)
    rng = random.Random(regex)
    for _ in range(400):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 6)))
        assert _accepts(small, 0, small_end, text) == _accepts(nfa, start, end, text), text


def test_long_strings_paste_the_minimized_character(monkeypatch):
    """maxLength 255 over a JSON string's character: the same language, half the states."""
    node = ra.rep(STRING_UNIT, 0, 255)
    exact_nfa, _, _ = automaton.build_nfa(node)
    exact = LazyDFA(node)
    monkeypatch.setattr(automaton, "MINIMIZE_AFTER_PASTES", 10 ** 9)
    monkeypatch.setattr(automaton, "_FRAGMENTS", {})
    plain_nfa, _, _ = automaton.build_nfa(ra.rep(STRING_UNIT, 0, 255))
    assert exact_nfa.num_states < 0.6 * plain_nfa.num_states
    for text, expected in [("a" * 255, True), ("a" * 256, False), ("\\u00e9" * 200, True),
                           ("\\ud83d\\ude00" * 255, True), ("\\ud83d" + "a", False), ("\U0001f600" * 255, True)]:
        assert exact.is_accepting(exact.walk(exact.start, text.encode())) == expected, text[:20]
