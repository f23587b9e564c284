"""A lazy DFA's transition table, grown past 4 MB in a mapping of its own
(``automaton._grown_table``), reads and grows like one from numpy."""
import numpy as np

from tamis.constrain import automaton
from tamis.constrain.automaton import UNCOMPUTED, LazyDFA
from tamis.constrain.regex_parser import parse_regex


def test_grown_tables_keep_their_rows_and_are_writable():
    old = np.arange(32 * 256, dtype=np.int32).reshape(32, 256)
    for rows in (64, 8192):
        table = automaton._grown_table(old, rows)
        assert table.shape == (rows, 256) and table.dtype == np.int32
        assert table.flags.c_contiguous and table.flags.writeable
        assert (table[:32] == old).all() and (table[32:] == UNCOMPUTED).all()
        table[rows - 1] = 7
        assert table[rows - 1, 255] == 7


def test_a_dfa_grown_past_the_threshold_walks_alike():
    dfa = LazyDFA(parse_regex("(ab){3000}c"))
    state = dfa.walk(dfa.start, b"ab" * 3000)
    assert len(dfa.trans) * 256 * 4 >= automaton._OWN_MAPPING_BYTES
    assert not dfa.is_accepting(state) and dfa.is_accepting(dfa.walk(state, b"c"))
    assert dfa.walk(dfa.start, b"ab" * 2999 + b"c") == automaton.DEAD
