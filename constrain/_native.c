/* The compiled core of the constraint layer: lazy-DFA rows, vocabulary-trie walks and
 * the pairs of a product of two lazy DFAs.
 *
 * Hot loops of a first visit, each with a numpy/Python reference beside it (used when
 * this module is not built, or with TAMIS_NATIVE_CONSTRAIN=0):
 *
 *   NFARows(edge_start, edge_lo, edge_hi, edge_to, eps_start, eps_to, class_of, accept)
 *     The subset construction over one sealed NFA (automaton.LazyDFA._build_row and
 *     _state_of's index): the arrays are the nfa.NFA's CSR arrays (int32), ``class_of``
 *     its 256 byte classes as bytes. It holds the DFA's states, each an NFA set, numbered
 *     as added, found through a hash table of the sets.
 *     .state_of(nfa_set) -> the state named by the set (its order as given), added if new;
 *       -1 (DEAD) for the empty set
 *     .build(state, trans, flags, accepting) -> the number of states: one step of the
 *       subset construction from ``state``'s set. For each byte class, the union of the
 *       edge targets of the set's states, closed over epsilon edges and kept to the
 *       important states (those with a byte edge, and ``accept``), sorted; the distinct
 *       ones added as states in the order the reference first meets them (so both number
 *       new DFA states alike), and trans[state] written with them (DEAD where a class has
 *       no target). For the states added since ``len(accepting)`` (a list), flags[s]
 *       (bool array, whether the set holds ``accept``) and then accepting.append(...)
 *       first. When trans or flags has too few rows for the new states, nothing is
 *       written: the caller makes room and calls again.
 *     .state_at(nfa_state) -> the state named by the closure of one NFA state (the important
 *       states reachable from it without input, sorted), added if new; -1 if empty
 *     .set_of(state) -> its set as a tuple; .accepting_flags(lo, hi) -> one byte per state
 *       lo .. hi - 1, 1 where its set holds ``accept``; .num_states
 *
 *   Trie(child_start, byte, under_lo, ending_here, by_bytes)
 *       .walk(dfa, state, tokens_out, first_bytes, ends) -> (end tokens, cuts)
 *     token_trie.live_tokens over the trie laid out depth first (built once per vocabulary
 *     from token_trie.VocabTrie's arrays): a dead node's subtree is skipped in one step.
 *     Marks tokens_out[t] for the tokens spelled by the trie nodes whose prefix stays live
 *     from ``state`` (its first byte in ``first_bytes`` when given). With ``ends`` 1
 *     (native.ENDS_PAIRS) it returns the (token, k) pairs whose first k bytes (k shorter
 *     than the token) reach an accepting state, as int32 bytes; with 2 (ENDS_NODES) the
 *     same ends as (nodes, b''): the depth-first positions of the live nodes with
 *     children whose state accepts, each standing for the tokens below it. It reads ``dfa.trans`` (int32
 *     [states, 256]); a row not built yet (entry 0 UNCOMPUTED) is built by calling
 *     ``dfa.row(state)``, after which ``dfa.trans`` and ``dfa.accepting_array()`` are read
 *     again (both may have been replaced). It builds the rows the reference builds: those
 *     of the states of live nodes with children. A subtree whose bytes all follow one
 *     chain of states (a string's content, looping or counted) is marked without a walk.
 *     .walk_below(dfa, state, nodes, tokens_out): for each node, marks the tokens below it
 *       whose bytes past the node's prefix stay live from ``state`` (the crossing walk of
 *       lexeme_ends.NodeEnds); .next_bytes(nodes) -> 256 bytes, 1 for the bytes of the
 *       nodes' children; .end_pairs(nodes) -> the (token, k) pairs the nodes stand for.
 *
 *   product_runs(left, right, left_start, right_start, alphabet, diff, max_states, check,
 *                counter=None) -> (pairs, accepting, runs), or None past max_states
 *     product._ProductBuilder._explore_python: the pairs of two lazy DFAs (``left``,
 *     ``right``, private to the caller: no other thread may use them meanwhile; a missing
 *     row is built in place through dfa._native_rows, as LazyDFA._build_row builds it,
 *     dfa.row called only when dfa.trans must grow; without the compiled index, or when
 *     both are one DFA, read as Trie.walk reads them) reachable from (left_start, right_start) over the symbols
 *     0 .. alphabet - 1, a pair expanded last-found first, numbered as found. ``pairs``:
 *     int32 (left, right) per id; ``accepting``: one byte per id, the left side accepting
 *     and the right side accepting (``diff``: not accepting, a DEAD right side included);
 *     ``runs``: int32 (pair, lo, hi, target pair) for each run of symbols with one target
 *     pair, live (a DEAD right side is live in a difference), in the order the reference
 *     meets them. ``check()`` is called before every 1,024th new pair (the deadline);
 *     None when a pair past ``max_states`` is found. It builds the rows the reference
 *     builds, in the same order. With ``counter`` = (rows, lo, cap, saturate), the right
 *     side is product._UnitCounter instead (``right`` is not read): a count of units
 *     (rows: int32 [units, alphabet], DEAD, a unit state or ``units`` for a unit's end)
 *     whose rows and accepting flags are computed, not read.
 *
 *   walk_items(dfa, flat, tok, at, st, want_ends) -> (accepted, end tokens, end positions)
 *     token_walk.walk_numpy: items (token tok[i], position at[i] in ``flat``, state st[i])
 *     walked over their token's remaining bytes (``flat``: token_table.TokenTable.flat,
 *     int16, each token's bytes then PAD = 256; tok, at, st: int64), rows built through
 *     dfa.row as above. ``accepted``: int32 ids of the items whose walk stays live to
 *     their PAD, in item order; with ``want_ends``, int32 (token, position) pairs where
 *     an item's walk reaches an accepting state before its token's last byte.
 *
 *   reaching(num_states, sources, targets, accept) -> bytes
 *     nfa._reaching_python: one byte per NFA state, 1 for the states with a path to
 *     ``accept`` over the edges sources[i] -> targets[i] (int32, byte and epsilon edges
 *     alike): the trim of a sealed NFA.
 *
 *   shifted_states(table, state_columns, offset, start) -> bytes
 *     nfa._shifted_python: the rows of a sealed fragment's edge table (int32 [n, k], k <= 8)
 *     as pasted: in each column whose bit is set in ``state_columns`` (the states), state 0
 *     becomes ``start`` and every other state s becomes s + offset; int32 bytes, row-major.
 *
 *   read_arrays(edge_table, eps_table, num_states) -> (edge_start, edge_lo, edge_hi, edge_to,
 *                                                       eps_start, eps_to)
 *     nfa._read_arrays_python: a sealed NFA's tables (int32 [n, 4] and [m, 2], sorted by
 *     source state) as the per-state offsets (num_states + 1) and columns that NFA.edges_of
 *     and NFARows read; int32 bytes each.
 *
 *   sorted_by_source(table, num_states) -> bytes
 *     nfa._by_source_python: the rows of ``table`` (int32 [n, k], column 0 a source state
 *     in 0 .. num_states - 1) sorted by source, stably (a counting sort); int32 bytes.
 *
 *   byte_classes(edge_table) -> bytes
 *     nfa._byte_classes_python: each byte's class (0, 1, ...), classes cut at byte 0 and at
 *     every edge's lo and hi + 1 (no edge splits one); 256 bytes.
 *
 *   build_nfa(nfa, node, start, context) -> end; build_nfa_node(...) -> end;
 *   nfa_size(node, context) -> int
 *     automaton._build_python, _build_node_python and _size_python: the regex AST's plain
 *     kinds (characters of ASCII classes, sequences, alternations, repetitions) built into
 *     the unsealed nfa.NFA ``nfa`` from state ``start``, the rest (and every fragment
 *     paste or record) through the Python helpers in ``context``
 *     (automaton._native_context()): the same states and edges, in the same order, and
 *     the same caches filled as the Python builder.
 *   EarleyTables(num_nonterminals, num_symbols, start, lhs, rhs_start, rhs, by_lhs_start,
 *                by_lhs, nullable)
 *       .closure(kernel, position, new_set) -> (waiting, accepting)
 *     earley.EarleySet._closure over a grammar's productions as int32 arrays (CSR: the
 *     right-hand sides by production, the productions by left-hand side; nullable one
 *     byte a nonterminal): from ``kernel`` (a list of (p, d, o) tuples, in the order the
 *     reference takes them), the items of the set at ``position``, completed against the
 *     sets of earlier origins found by new_set.ancestor(origin).waiting. ``waiting``: symbol
 *     after the dot -> tuple of the items waiting on it, each in the reference's order;
 *     ``accepting``: whether a start production is complete from origin 0.
 *   untrack_ast(node) -> bool
 *     The tuples of the regex AST ``node`` untracked by the garbage collector, as the
 *     collector itself untracks a tuple none of whose items may be tracked, for the whole
 *     tree at once (it would take a full collection per level); True when ``node`` is
 *     untracked afterwards.
 *
 * Files: _native_rows.c (NFARows, reaching, NFA tables), _native_product.c (product_runs),
 * _native_trie.c (Trie, walk_items), _native_build.c (the NFA builder), _native_earley.c
 * (EarleyTables), _native_common.h (int arrays, buffers, a lazy DFA read
 * from Python); this one holds the module.
 */
#include "_native_common.h"

/* Bumped when a signature or result changes: native.py refuses a stale build. */
#define NATIVE_VERSION 17

static PyMethodDef module_methods[] = {
    {"product_runs", product_runs, METH_VARARGS,
     "product_runs(left, right, left_start, right_start, alphabet, diff, max_states, check, "
     "counter=None) -> (pairs, accepting, runs) or None: the reachable pairs of two lazy DFAs "
     "(or of a lazy DFA and a count of units)"},
    {"walk_items", walk_items, METH_VARARGS,
     "walk_items(dfa, flat, tok, at, st, want_ends) -> (accepted, end tokens, end positions): "
     "tokens' remaining bytes walked through a lazy DFA"},
    {"shifted_states", shifted_states, METH_VARARGS,
     "shifted_states(table, state_columns, offset, start) -> bytes: a fragment's edge rows "
     "as pasted"},
    {"read_arrays", read_arrays, METH_VARARGS,
     "read_arrays(edge_table, eps_table, num_states) -> the per-state offsets and columns of a "
     "sealed NFA"},
    {"sorted_by_source", sorted_by_source, METH_VARARGS,
     "sorted_by_source(table, num_states) -> bytes: the rows sorted by their source, stably"},
    {"byte_classes", byte_classes, METH_O,
     "byte_classes(edge_table) -> bytes: each byte's class, no edge splitting one"},
    {"build_nfa", build_nfa, METH_VARARGS,
     "build_nfa(nfa, node, start, context) -> end: automaton._build_python in C"},
    {"build_nfa_node", build_nfa_node, METH_VARARGS,
     "build_nfa_node(nfa, node, start, context) -> end: automaton._build_node_python in C"},
    {"nfa_size", nfa_size, METH_VARARGS,
     "nfa_size(node, context) -> int: automaton._size_python in C"},
    {"untrack_ast", untrack_ast, METH_O,
     "untrack_ast(node) -> bool: the AST's tuples untracked by the garbage collector"},
    {"reaching", reaching, METH_VARARGS,
     "reaching(num_states, sources, targets, accept) -> bytes: 1 for each state with a path "
     "to accept"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native",
    "The compiled core of the constraint layer (see constrain/native.py).", -1, module_methods,
};

static int
add_type(PyObject *m, PyTypeObject *type, const char *name)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (add_type(m, &NFARowsType, "NFARows") < 0 || add_type(m, &TrieType, "Trie") < 0
            || add_type(m, &EarleyTablesType, "EarleyTables") < 0
            || PyModule_AddIntConstant(m, "VERSION", NATIVE_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
