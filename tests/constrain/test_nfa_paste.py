"""Copies of a fragment pasted at once (``NFA.paste_chain``, ``automaton._build_copies``)
write the states and edges, in the same order, that pasting them one by one writes."""
import pytest

from tamis.constrain import automaton, regex_ast as ra
from tamis.constrain.nfa import NFA
from tamis.constrain.regex_parser import parse_regex

CHILD = r'([^"\\]|\\u[0-9a-f]{4}|\\["nt])'


def tables(nfa: NFA) -> tuple:
    nfa.seal()
    return nfa.num_states, nfa.edge_table.tobytes(), nfa.eps_table.tobytes()


def fragment(pattern: str):
    local = NFA()
    start = local.new_state()
    end = automaton._build_node(local, parse_regex(pattern), start)
    local.seal()
    return local, end


@pytest.mark.parametrize("pattern", [CHILD, "ab", "(ab)*", "x?"])
@pytest.mark.parametrize("with_exit", [False, True])
def test_a_chain_equals_pastes_one_by_one(pattern, with_exit):
    local, end = fragment(pattern)
    nfas = []
    for at_once in (False, True):
        nfa = NFA()
        start, exit = nfa.new_state(), nfa.new_state()
        state = start
        if at_once:
            state = nfa.paste_chain(local, state, end, 7, exit if with_exit else None)
        else:
            for _ in range(7):
                if with_exit:
                    nfa.add_eps(state, exit)
                state = nfa.paste(local, state, end)
        nfa.add_eps(state, exit)
        nfas.append(tables(nfa))
    assert nfas[0] == nfas[1]


@pytest.mark.parametrize("lo, hi", [(0, 30), (12, 40), (3, None), (20, 20), (0, 5), (300, 300)])
def test_a_counted_repetition_is_the_same_nfa(monkeypatch, lo, hi):
    node = ra.rep(parse_regex(CHILD), lo, hi)
    built = []
    for one_by_one in (False, True):
        for cache in ("_FRAGMENTS", "_SEEN_ONCE", "_MINIMAL", "_PASTES", "_SIZES"):
            monkeypatch.setattr(automaton, cache, {})
        if one_by_one:      # the Python builder (the compiled one settles in C)
            monkeypatch.setattr(automaton, "_settled_fragment", lambda node: None)
            monkeypatch.setattr(automaton, "_build", automaton._build_python)
            monkeypatch.setattr(automaton, "_build_node", automaton._build_node_python)
        nfa, start, accept = automaton.build_nfa(node)
        built.append((tables(nfa), start, accept))
    assert built[0] == built[1]


@pytest.mark.parametrize("pattern", [CHILD, "ab", "(ab)*", "x?", "[a-z]+@[a-z]+"])
def test_shifted_states_in_the_core_equal_the_reference(pattern):
    """``nfa._shifted_python`` against ``native.CORE.shifted_states`` (when it is built)."""
    from tamis.constrain import native, nfa as nfa_module
    core = native.CORE
    if core is None:
        pytest.skip("the compiled core is not built")
    local, _ = fragment(pattern)
    for table, columns in ((local.edge_table, nfa_module._EDGE_COLUMNS),
                           (local.eps_table, nfa_module._EPS_COLUMNS)):
        for offset, start in ((0, 0), (5, 3), (1000, 77)):
            assert core.shifted_states(table, columns, offset, start) == \
                nfa_module._shifted_python(local, table, offset, start)


@pytest.mark.parametrize("pattern", [CHILD, "ab", "(ab)*", "x?", "[a-z]+@[a-z]+", "é|😀*", "[^a]"])
def test_read_arrays_and_byte_classes_in_the_core_equal_the_reference(pattern):
    """``nfa._read_arrays_python`` and ``nfa._byte_classes_python`` against the compiled
    core's ``read_arrays`` and ``byte_classes`` (when it is built)."""
    from tamis.constrain import native, nfa as nfa_module
    core = native.CORE
    if core is None:
        pytest.skip("the compiled core is not built")
    local, _ = fragment(pattern)
    tables_ = (local.edge_table, local.eps_table, local.num_states)
    assert core.read_arrays(*tables_) == nfa_module._read_arrays_python(*tables_)
    assert core.byte_classes(local.edge_table) == nfa_module._byte_classes_python(local.edge_table)


@pytest.mark.parametrize("pattern", [CHILD, "ab", "(ab)*", "x?", "[a-z]+@[a-z]+", "é|😀*"])
def test_sorted_by_source_in_the_core_equals_the_reference(pattern):
    """``nfa._by_source_python`` against the compiled core's ``sorted_by_source``, on the
    unsorted rows a build writes (when the core is built)."""
    import numpy as np
    from tamis.constrain import native, nfa as nfa_module
    core = native.CORE
    if core is None:
        pytest.skip("the compiled core is not built")
    local = NFA()
    automaton._build_node(local, parse_regex(pattern), local.new_state())
    for flat, width in ((local._edges, 4), (local._eps, 2)):
        table = np.frombuffer(flat, dtype=np.int32).reshape(-1, width)
        assert core.sorted_by_source(table, local.num_states) == \
            nfa_module._by_source_python(table).tobytes()
