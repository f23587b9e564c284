"""The compiled core (constrain/_native.c) against its numpy/Python reference: DFA rows
(``LazyDFA._build_row_python``), trie walks (``token_trie.walk_trie_numpy``), the token
masks of ``token_walk.allowed`` (the chain path), item walks (``token_walk.walk_numpy``) and
the trim (``nfa._reaching_python``), a grammar terminal's ends as trie nodes
(``lexeme_ends.NodeEnds`` against ``ItemEnds``), on random regexes, maskbench JSON schemas and the
SmolLM2 vocabulary. The product walk: test_native_product.py.

The extension must be built (``pip install -e .`` builds it; CI runs that): a missing or
stale build fails these tests instead of skipping them.
"""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import random_regexes
from conformance import maskbench_sample, smollm2
from tamis.constrain import ConstraintError, StructuredOutputsParams, compile_constraint, native
from tamis.constrain import nfa as nfa_module
from tamis.constrain.automaton import DEAD, LazyDFA, build_nfa
from tamis.constrain.lexeme_ends import NodeEnds, state_row_with_ends
from tamis.constrain.regex_parser import parse_regex
from tamis.constrain.token_trie import live_tokens, trie_tokens, walk_trie_numpy
from tamis.constrain.token_walk import allowed, walk, walk_numpy

SEED = random.randrange(1 << 30)


@pytest.fixture(scope="module")
def table():
    return smollm2()[1].trie


def test_extension_is_built_and_used():
    assert native.load_extension().VERSION == native.VERSION
    if os.environ.get("TAMIS_NATIVE_CONSTRAIN", "1").strip() != "0":
        assert native.CORE is not None


def test_env_var_turns_it_off():
    code = "from tamis.constrain import native; print(native.CORE is None)"
    for value, off in (("0", "True"), ("1", "False")):
        env = {**os.environ, "TAMIS_NATIVE_CONSTRAIN": value}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.stdout.split() == [off], done.stderr


# ---- automata to compare on -------------------------------------------------------------

ATOMS = ["a", "b", "z", "0", "9", " ", "\\n", "é", "€", "😀", "\\.", "\"", "\\\\",
         "[a-z]", "[^\"\\\\]", "[0-9a-f]", "\\d", "\\w", "\\s", ".", "[^x]", "[é-ü]"]


def random_regex(rng: random.Random) -> str:
    return random_regexes.random_regex(rng, ATOMS)


def regex_nfas(rng: random.Random, count: int) -> list:
    """(description, NFA, start, accept) of ``count`` random regexes."""
    out = []
    while len(out) < count:
        pattern = random_regex(rng)
        try:
            nfa, start, accept = build_nfa(parse_regex(pattern))
        except ConstraintError:
            continue
        out.append((pattern, nfa, start, accept))
    return out


def schema_nfas(rng: random.Random, count: int, info) -> list:
    """(description, NFA, start, accept) of the automata of ``count`` maskbench schemas: the
    whole-schema DFA of a regular one, the terminals of a grammar."""
    out = []
    files = [path for _, path in maskbench_sample(3)]
    for path in rng.sample(files, count):
        try:
            compiled = compile_constraint(
                StructuredOutputsParams(json=json.loads(path.read_text())["schema"]), info)
        except ConstraintError:
            continue
        dfas = [compiled.dfa] if hasattr(compiled, "dfa") else \
            [compiled.dfas[i] for i in rng.sample(range(len(compiled.dfas)), min(6, len(compiled.dfas)))]
        for dfa in dfas:
            if dfa.start != DEAD:
                start_set = dfa.sets[dfa.start]
                out.append((path.name, dfa.nfa, start_set, dfa.nfa_accept))
    return out


def fresh_dfa(nfa, start, accept) -> LazyDFA:
    """A new DFA over ``nfa``; ``start`` is an NFA state or a start state's NFA set."""
    dfa = LazyDFA.from_nfa(nfa, accept)
    dfa.start = dfa.state_of_set(start) if isinstance(start, tuple) else dfa.start_at(start)
    return dfa


def explore(dfa: LazyDFA, limit: int) -> list:
    """States in breadth-first order from the start, building their rows (up to ``limit``)."""
    order, seen = [dfa.start], {dfa.start}
    for state in order:
        if len(order) >= limit:
            break
        for target in sorted(set(dfa.row(state).tolist())):
            if target >= 0 and target not in seen:
                seen.add(target)
                order.append(target)
    return order


def automata(seed: int) -> list:
    rng = random.Random(seed)
    return regex_nfas(rng, 25) + schema_nfas(rng, 8, smollm2()[1])


# ---- rows ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [SEED])
def test_rows_equal_the_python_subset_construction(core, monkeypatch, seed):
    """Both build the same DFA: the same sets in the same order (new states numbered alike),
    the same transitions and accepting flags."""
    for description, nfa, start, accept in automata(seed):
        monkeypatch.setattr(native, "CORE", None)
        reference = fresh_dfa(nfa, start, accept)
        explore(reference, 400)
        monkeypatch.setattr(native, "CORE", core)
        compiled = fresh_dfa(nfa, start, accept)
        explore(compiled, 400)
        where = (seed, description)
        assert compiled._native_rows is not None, where
        assert compiled.sets == reference.sets, where
        built = reference.trans[:reference.num_states, 0] != -2
        assert (compiled.trans[:compiled.num_states][built]
                == reference.trans[:reference.num_states][built]).all(), where
        assert compiled.accepting == reference.accepting, where
        assert (compiled.accepting_array() == np.asarray(reference.accepting)).all(), where


def test_rows_of_states_added_by_name(core):
    """A DFA whose states come from another one's NFA sets (the row workers' use): rows built
    in any order name the same target sets."""
    nfa, start, accept = build_nfa(parse_regex(r'"([^"\\]|\\u[0-9a-f]{4}){0,9}"'))
    reference = fresh_dfa(nfa, start, accept)
    states = explore(reference, 200)
    other = LazyDFA.from_nfa(nfa, accept)
    for state in reversed(states):
        mine = other.state_of_set(reference.sets[state])
        got = [other.sets[t] if t >= 0 else None for t in other.row(mine).tolist()]
        want = [reference.sets[t] if t >= 0 else None for t in reference.row(state).tolist()]
        assert got == want


def test_bad_arrays_are_refused(core):
    nfa, _, accept = build_nfa(parse_regex("ab*"))
    with pytest.raises(ValueError):
        core.NFARows(nfa.edge_start, nfa.edge_lo, nfa.edge_hi, nfa.edge_to, nfa.eps_start,
                     nfa.eps_to[:-1] if len(nfa.eps_to) else nfa.edge_to, bytes(256), accept)
    rows = core.NFARows(nfa.edge_start, nfa.edge_lo, nfa.edge_hi, nfa.edge_to, nfa.eps_start,
                        nfa.eps_to, bytes(256), accept)
    with pytest.raises(ValueError):
        rows.state_of((nfa.num_states,))               # no such NFA state
    trans, flags = np.full((4, 256), -2, dtype=np.int32), np.zeros(4, dtype=bool)
    with pytest.raises(IndexError):
        rows.build(0, trans, flags, [])                # no DFA state 0 yet
    assert rows.state_of((0,)) == 0
    with pytest.raises(ValueError):
        rows.build(0, trans[:, :255], flags, [])       # rows of 255 entries


# ---- trie walks and masks -----------------------------------------------------------------

def walk_states(dfa: LazyDFA, rng: random.Random, table, count: int) -> list:
    """``count`` states met by reading random tokens from the start (inside strings, keys...)."""
    ids = np.flatnonzero(table.lengths > 0)
    states, state = {dfa.start}, dfa.start
    for _ in range(count * 30):
        if len(states) >= count:
            break
        nxt = dfa.walk(state, table.token_bytes[int(rng.choice(ids))])
        if nxt != DEAD:
            state = nxt
            states.add(state)
        elif rng.random() < 0.1:
            state = dfa.start
    return sorted(states)


def end_pairs(ends: list) -> set:
    return {(int(t), int(k)) for tok, cut in ends for t, k in zip(tok, cut)}


@pytest.mark.parametrize("seed", [SEED])
def test_trie_walk_equals_the_numpy_walk(core, table, monkeypatch, seed):
    """The tokens marked by the compiled walk and its ends are the numpy walk's live nodes'
    tokens and ends, with and without a first-byte filter."""
    monkeypatch.setattr(native, "CORE", core)
    rng = random.Random(seed)
    for description, nfa, start, accept in automata(seed):
        dfa = fresh_dfa(nfa, start, accept)
        for state in walk_states(dfa, rng, table, 4):
            first_bytes = np.array([rng.random() < 0.5 for _ in range(256)])
            for chosen in (None, first_bytes):
                where = (seed, description, state, chosen is None)
                want_ends, got_ends = [], []
                want = walk_trie_numpy(table.trie, dfa, state, want_ends, chosen)
                got = live_tokens(table, dfa, state, got_ends, chosen)
                assert (got == trie_tokens(table, want)).all(), where
                assert end_pairs(got_ends) == end_pairs(want_ends), where


@pytest.mark.parametrize("seed", [SEED])
def test_allowed_equals_the_chain_path(core, table, monkeypatch, seed):
    """``allowed`` through the compiled walk gives the masks and ends of the numpy chain path."""
    rng = random.Random(seed)
    for description, nfa, start, accept in automata(seed):
        dfa = fresh_dfa(nfa, start, accept)
        for state in walk_states(dfa, rng, table, 4):
            for with_ends in (False, True):
                where = (seed, description, state, with_ends)
                monkeypatch.setattr(native, "CORE", None)
                want_ends = [] if with_ends else None
                want = allowed(table, dfa, state, want_ends)
                monkeypatch.setattr(native, "CORE", core)
                got_ends = [] if with_ends else None
                got = allowed(table, dfa, state, got_ends)
                assert (got == want).all(), where
                if with_ends:
                    assert end_pairs(got_ends) == end_pairs(want_ends), where


@pytest.mark.parametrize("seed", [SEED])
def test_lexeme_ends_as_nodes_equal_the_items(core, table, monkeypatch, seed):
    """The compiled walk's end nodes stand for the numpy path's (token, cut) ends, follow the
    same bytes, and continue into the same tokens from another automaton's states."""
    rng = random.Random(seed)
    built = list(automata(seed))
    for (description, nfa, start, accept), (_, other_nfa, other_start, other_accept) in \
            zip(built, built[1:] + built[:1]):
        dfa = fresh_dfa(nfa, start, accept)
        other = fresh_dfa(other_nfa, other_start, other_accept)
        for state in walk_states(dfa, rng, table, 4):
            where = (seed, description, state)
            monkeypatch.setattr(native, "CORE", None)
            want_alive, want = state_row_with_ends(table, dfa, state)
            monkeypatch.setattr(native, "CORE", core)
            got_alive, got = state_row_with_ends(table, dfa, state)
            assert isinstance(got, NodeEnds), where
            assert (got_alive == want_alive).all(), where
            items = got.as_items()
            assert end_pairs([(items.tokens, items.cuts)]) == \
                end_pairs([(want.tokens, want.cuts)]), where
            assert (got.next_bytes(table) == want.next_bytes(table)).all(), where
            for next_state in walk_states(other, rng, table, 3):
                want_cross = np.zeros(table.vocab_size, dtype=bool)
                got_cross = np.zeros(table.vocab_size, dtype=bool)
                want.continued(table, other, next_state, want_cross)
                got.continued(table, other, next_state, got_cross)
                assert (got_cross == want_cross).all(), (where, next_state)


def test_walk_builds_rows_of_a_growing_table(core, table, monkeypatch):
    """A walk from a fresh DFA builds its rows as it goes (the table regrows many times under
    it) and still equals the numpy walk on a DFA built beforehand."""
    monkeypatch.setattr(native, "CORE", core)
    nfa, start, accept = build_nfa(parse_regex(r"[a-z ]{0,60}(ab|cd)[a-z ]{0,60}"))
    fresh = fresh_dfa(nfa, start, accept)
    assert len(fresh.trans) == 64
    ends: list = []
    got = live_tokens(table, fresh, fresh.start, ends)
    assert fresh.num_states > 64
    built = fresh_dfa(nfa, start, accept)
    want_ends: list = []
    want = trie_tokens(table, walk_trie_numpy(table.trie, built, built.start, want_ends))
    assert (got == want).all()
    assert end_pairs(ends) == end_pairs(want_ends)


# ---- item walks ---------------------------------------------------------------------------

def random_items(rng: random.Random, table, states: list, count: int) -> tuple:
    """(tok, pos, st) of ``count`` items: random tokens, a position inside each (its end
    included), a state of ``states``."""
    ids = np.flatnonzero(table.lengths > 0)
    tok = np.array([int(rng.choice(ids)) for _ in range(count)], dtype=np.int64)
    pos = np.array([rng.randint(0, int(table.lengths[t])) for t in tok], dtype=np.int64)
    st = np.array([rng.choice(states) for _ in range(count)], dtype=np.int64)
    return tok, pos, st


@pytest.mark.parametrize("seed", [SEED])
def test_item_walk_equals_the_numpy_walk(core, table, seed):
    """``token_walk.walk`` (the compiled item walk) keeps the items and records the ends the
    numpy walk does, for few items (its plain Python loop) and many (its chains)."""
    rng = random.Random(seed)
    for description, nfa, start, accept in automata(seed):
        dfa = fresh_dfa(nfa, start, accept)
        states = walk_states(dfa, rng, table, 6)
        for count in (5, 3000):
            tok, pos, st = random_items(rng, table, states, count)
            where = (seed, description, count)
            want_ends, got_ends = [], []
            want = walk_numpy(table, dfa, tok, pos, st, want_ends)
            got = walk(table, dfa, tok, pos, st, got_ends)
            assert sorted(got.tolist()) == sorted(want.tolist()), where
            assert end_pairs(got_ends) == end_pairs(want_ends), where
            assert (walk(table, dfa, tok, pos, st) == got).all(), where


def test_item_walk_builds_rows_of_a_growing_table(core, table):
    nfa, start, accept = build_nfa(parse_regex(r"[a-z ]{0,60}(ab|cd)[a-z ]{0,60}"))
    fresh = fresh_dfa(nfa, start, accept)
    tok, pos, st = random_items(random.Random(3), table, [fresh.start], 20_000)
    pos[:] = 0
    got = walk(table, fresh, tok, pos, st)
    assert fresh.num_states > 64
    built = fresh_dfa(nfa, start, accept)
    assert sorted(got.tolist()) == sorted(walk_numpy(table, built, tok, pos, st).tolist())


def test_item_walk_refuses_positions_outside_the_table(core, table):
    nfa, start, accept = build_nfa(parse_regex("a*"))
    dfa = fresh_dfa(nfa, start, accept)
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(IndexError):
        core.walk_items(dfa, table.flat, one, one + len(table.flat), one + dfa.start, False)


# ---- the trim -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [SEED])
def test_reaching_equals_the_python_trim(core, seed):
    """The states that can reach the accept state: random graphs, and the NFAs compared above."""
    rng = np.random.default_rng(seed)
    graphs = []
    for num_states in (1, 2, 50, 3000):
        edges = int(rng.integers(0, 3 * num_states))
        graphs.append((num_states, rng.integers(0, num_states, edges, dtype=np.int32),
                       rng.integers(0, num_states, edges, dtype=np.int32),
                       int(rng.integers(0, num_states))))
    for _, nfa, _, accept in automata(seed):
        tables = (nfa.edge_table[:, [0, 3]], nfa.eps_table)
        graphs.append((nfa.num_states, np.concatenate([t[:, 0] for t in tables]),
                       np.concatenate([t[:, 1] for t in tables]), accept))
    for num_states, sources, targets, accept in graphs:
        want = nfa_module._reaching_python(num_states, sources, targets, accept)
        got = np.frombuffer(core.reaching(num_states, np.ascontiguousarray(sources),
                                          np.ascontiguousarray(targets), accept), dtype=bool)
        assert (got == want).all(), (seed, num_states)
    with pytest.raises(ValueError):
        core.reaching(2, np.array([0, 5], np.int32), np.array([1, 1], np.int32), 1)
