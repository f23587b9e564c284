"""Regex AST -> byte-level NFA (Thompson) -> DFA built lazily, one row at a time.

A DFA state is the set of "important" NFA states (those with a byte edge, or the accept
state) reachable without reading input. ``LazyDFA.trans`` is a dense int32 table
``[states, 256]``: ``-1`` = dead, ``UNCOMPUTED`` = row not built yet; ``row(s)`` builds a
row on first use, so compiling costs only the NFA and the start state, and the
work is spread over the states generation actually visits.

The NFA is trimmed to states that can still reach the accept state, so every live DFA
state can be completed: a live state is never a dead end.

With the compiled core (``native.CORE.NFARows``), a row's subset-construction step (each
byte class's target set) and the index of the DFA's NFA state sets (set -> state, new sets
numbered as met) run there: ``sets`` reads a state's set from it on access. Without it,
``_build_row_python`` and a dict of tuples are the reference. Both meet the target sets in
the same order, so they number new states alike.
"""
from __future__ import annotations

import mmap
import threading

import numpy as np

from . import regex_ast as ra
from . import deadline, native
from . import nfa as nfa_module
from .errors import ConstraintError
from .nfa import MAX_NFA_STATES, NFA
from .utf8 import utf8_sequences

DEAD = -1
UNCOMPUTED = -2


def build_nfa(node) -> tuple[NFA, int, int]:
    """(sealed NFA, start, accept) of ``node``, trimmed when a construct may dead-end."""
    core = native.CORE
    if core is not None:
        # The AST is kept as long as its automaton (fragments, sizes, the grammar): tens of
        # thousands of nested tuples that every full garbage collection would scan, and
        # that the collector stops tracking only one nesting level per full collection.
        core.untrack_ast(node)
    # A tree past twice the limit is refused before building; below that, fragments
    # replaced by their minimal DFA may still fit (the states are counted as they come).
    if _size(node) > 2 * MAX_NFA_STATES:
        raise ConstraintError(
            f"constraint too large: its automaton would exceed {MAX_NFA_STATES} states "
            "(reduce repetition counts such as maxLength/maxItems, or shared definitions)")
    nfa = NFA()
    start = nfa.new_state()
    accept = _build(nfa, node, start)
    nfa.seal(accept)
    return nfa, start, accept


# Fragments of shared sub-expressions, built once and then copied with an offset: the AST is
# a DAG (one whitespace node, one string node... used in many places), and copying a
# fragment's edge arrays is far cheaper than rebuilding it node by node. A fragment is
# (node, its sealed NFA with state 0 its start, its end state).
_FRAGMENTS: dict = {}
_FRAGMENT_MIN_SIZE = 8
_FRAGMENTS_MAX = 4096


def _build(nfa: NFA, node, start: int) -> int:
    """Builds ``node`` into ``nfa`` from ``start``; returns its end state. The compiled core
    builds the plain kinds (characters, sequences, alternations, repetitions) itself and
    calls the Python helpers below for the rest; ``_build_python`` is its reference (the
    same states and edges in the same order, the same caches filled)."""
    core = native.CORE
    if core is not None:
        return core.build_nfa(nfa, node, start, _native_context())
    return _build_python(nfa, node, start)


def _build_python(nfa: NFA, node, start: int) -> int:
    fragment = _FRAGMENTS.get(id(node))
    if fragment is not None and fragment[0] is node:
        return _paste_again(nfa, fragment, start)
    small = _size(node) < _FRAGMENT_MIN_SIZE and node[0] not in ("and", "diff")  # products: costly
    if node[0] in ("chars", "rule") or small:
        return _build_node(nfa, node, start)
    if id(node) not in _SEEN_ONCE and node[0] not in ("and", "diff"):
        # record only shared nodes: recording copies every state once more per nesting level.
        # A product is recorded at once: one copy costs far less than building it again, and
        # a grammar's property-name difference recurs in two terminals (first member, others)
        _SEEN_ONCE[id(node)] = node
        if len(_SEEN_ONCE) > 100_000:
            _SEEN_ONCE.clear()
        return _build_node(nfa, node, start)
    return _record_and_paste(nfa, node, start)


def _paste_again(nfa: NFA, fragment, start: int) -> int:
    return _paste(nfa, _pasted_again(fragment), start)


def _record_and_paste(nfa: NFA, node, start: int) -> int:
    """``node`` met again: recorded as a fragment, then pasted."""
    fragment = _record(node)
    _PASTES[id(node)] = 0
    if len(_FRAGMENTS) >= _FRAGMENTS_MAX:
        _FRAGMENTS.clear()
        _PASTES.clear()
    _FRAGMENTS[id(node)] = fragment
    return _paste(nfa, fragment, start)


_SIZES: dict = {}
_SEEN_ONCE: dict = {}


def estimated_states(node) -> int:
    """The NFA states ``node`` would take, before fragments are minimised (an upper bound)."""
    return _size(node)


def _size(node) -> int:
    core = native.CORE
    if core is not None:
        return core.nfa_size(node, _native_context())
    return _size_python(node)


def _size_python(node) -> int:
    found = _SIZES.get(id(node))
    if found is not None and found[0] is node:
        return found[1]
    if len(_SIZES) > 100_000:
        _SIZES.clear()
    deadline.check()
    # Children through the same cache: every node of a build asks for its size once.
    shared = ra.props_shared_tail(node) if node[0] == "props" else None
    if node[0] in ("and", "diff"):
        # The operands become automata of their own; this NFA holds the product's reachable
        # pairs. An intersection may keep as many as both operands together (a pattern
        # within a length bound); a difference keeps about its left operand's states: the
        # subtracted language only marks pairs (any key less 40 declared names, whose
        # escaped spellings take ~10,000 states, keeps a few hundred). An estimate only:
        # the build counts the states it makes, and a product stops at MAX_PRODUCT_STATES.
        left, right = _size(node[1]), _size(node[2])
        size = 1 + (left if node[0] == "diff" else left + right)
    elif shared is not None:       # tail_some is read once (_build_props)
        size = 1 + sum(_size(member) for member, _ in node[1]) + _size(node[2]) \
            + _size(shared[0]) + _size(node[4])
    else:
        size = 1 + sum(_size(child) for child in ra.children(node)) * ra.repeat_factor(node)
    _SIZES[id(node)] = (node, size)
    return size


# A fragment pasted this often (a string's character under maxLength) is replaced by its
# minimal DFA when it has at most MAX_MINIMIZED_NFA states: rarely pasted ones are not worth it.
MINIMIZE_AFTER_PASTES = 8
MAX_MINIMIZED_NFA = 512
_PASTES: dict = {}


def _pasted_again(fragment) -> tuple:
    """``fragment``, minimized on its ``MINIMIZE_AFTER_PASTES``-th paste."""
    node = fragment[0]
    count = _PASTES.get(id(node), 0) + 1
    _PASTES[id(node)] = count
    if count != MINIMIZE_AFTER_PASTES or fragment[1].num_states > MAX_MINIMIZED_NFA:
        return fragment
    key = node if ra.is_small(node) else None     # small nodes recur in every compile (whitespace)
    minimal = _MINIMAL.get(key, _UNKNOWN) if key is not None else _UNKNOWN
    if minimal is _UNKNOWN:
        minimal = _minimal(fragment)
        if key is not None:
            if len(_MINIMAL) >= _FRAGMENTS_MAX:
                _MINIMAL.clear()
            _MINIMAL[key] = minimal
    if minimal is None:
        return fragment
    fragment = (node,) + minimal
    _FRAGMENTS[id(node)] = fragment
    return fragment


_MINIMAL: dict = {}      # small node (by value) -> its minimized (NFA, end), None if no smaller
_UNKNOWN = object()


def _minimal(fragment) -> tuple | None:
    """(sealed NFA, end) of ``fragment``'s minimal DFA, or None when that is no smaller."""
    from .minimize import minimal_fragment        # it builds a LazyDFA of the fragment
    _, local, end = fragment
    minimal = minimal_fragment(local, 0, end)
    if minimal is None or minimal[0].num_states >= local.num_states:
        return None
    return minimal


def _record(node) -> tuple:
    """(node, sealed NFA, end) of ``node`` built alone, states numbered from 0 (= its start)."""
    local = NFA()
    start = local.new_state()
    end = _build_node(local, node, start)
    local.seal()
    return (node, local, end)


def _paste(nfa: NFA, fragment, start: int) -> int:
    _, local, end = fragment
    return nfa.paste(local, start, end)


def _build_node(nfa: NFA, node, start: int) -> int:
    """``node`` built in place, no fragment looked up or recorded for it (its parts may)."""
    core = native.CORE
    if core is not None:
        return core.build_nfa_node(nfa, node, start, _native_context())
    return _build_node_python(nfa, node, start)


def _build_node_python(nfa: NFA, node, start: int) -> int:
    kind = node[0]
    if kind == "chars":
        return _build_chars(nfa, node[1], start)
    if kind == "seq":
        state = start
        for child in node[1]:
            state = _build(nfa, child, state)
        return state
    if kind == "alt":
        end = nfa.new_state()
        nfa.may_dead_end |= not node[1]
        for child in node[1]:
            branch = nfa.new_state()
            nfa.add_eps(start, branch)
            nfa.add_eps(_build(nfa, child, branch), end)
        return end
    if kind == "rep":
        return _build_rep(nfa, node[1], node[2], node[3], start)
    if kind in ("and", "diff"):
        from .product import build_product    # the product builds LazyDFAs of its operands
        return build_product(nfa, node[1], node[2], start, kind)
    if kind == "props":
        return _build_props(nfa, node, start)
    if kind == "multiple":
        return _build_multiple(nfa, node[1], node[2], start)
    raise ConstraintError(f"rule reference {node[1]!r} cannot be compiled into a regular automaton")


def _build_chars(nfa: NFA, ranges, start: int) -> int:
    """One character of ``ranges`` as UTF-8: the byte sequences share their states by the
    bytes left to read (the multi-byte characters of a JSON string end in the same few
    continuation runs: 9 states, 20 with a chain per sequence)."""
    end = nfa.new_state()
    if ranges and max(hi for _, hi in ranges) < 0x80:     # ASCII: one byte, an edge a range
        for lo, hi in ranges:
            nfa.add_edge(start, lo, hi, end)
        return end
    nfa.may_dead_end |= not any(utf8_sequences(lo, hi) for lo, hi in ranges)
    before: dict[tuple, int] = {}        # byte ranges left to read -> the state reading them

    def reading(rest: tuple) -> int:
        if not rest:
            return end
        state = before.get(rest)
        if state is None:
            state = before[rest] = nfa.new_state()
            nfa.add_edge(state, rest[0][0], rest[0][1], reading(rest[1:]))
        return state
    for lo, hi in ranges:
        for byte_ranges in utf8_sequences(lo, hi):
            first_lo, first_hi = byte_ranges[0]
            nfa.add_edge(start, first_lo, first_hi, reading(byte_ranges[1:]))
    return end


def _build_rep(nfa: NFA, child, lo: int, hi: int | None, start: int) -> int:
    state = _build_copies(nfa, child, lo, start, None)
    end = nfa.new_state()
    if hi is None:
        loop = nfa.new_state()
        nfa.add_eps(state, loop)
        nfa.add_eps(loop, end)
        nfa.add_eps(_build(nfa, child, loop), loop)
        return end
    state = _build_copies(nfa, child, hi - lo, state, end)
    nfa.add_eps(state, end)
    return end


def _build_copies(nfa: NFA, child, count: int, state: int, exit: int | None) -> int:
    """``count`` copies of ``child`` in a row from ``state`` (with ``exit``: an epsilon edge
    from each copy's start to ``exit`` first). Built one by one until the child's fragment is
    settled (recorded, and minimized or past being minimized), then the rest pasted at once:
    ``minLength`` 10,000 pastes a string's character 10,000 times."""
    for done in range(count):
        fragment = _settled_fragment(child)
        if fragment is not None:
            return _paste_copies(nfa, fragment, count - done, state, exit)
        if exit is not None:
            nfa.add_eps(state, exit)
        state = _build(nfa, child, state)
    return state


def _paste_copies(nfa: NFA, fragment, count: int, state: int, exit: int | None) -> int:
    """``count`` copies of a settled fragment pasted in a row (``_build_copies``)."""
    node = fragment[0]
    _PASTES[id(node)] = _PASTES.get(id(node), 0) + count
    return nfa.paste_chain(fragment[1], state, fragment[2], count, exit)


def _settled_fragment(node) -> tuple | None:
    """``node``'s fragment when further pastes leave it as it is (``_pasted_again``)."""
    fragment = _FRAGMENTS.get(id(node))
    if fragment is None or fragment[0] is not node:
        return None
    if fragment[1].num_states > MAX_MINIMIZED_NFA or \
            _PASTES.get(id(node), 0) >= MINIMIZE_AFTER_PASTES:
        return fragment
    return None


def _build_props(nfa: NFA, node, start: int) -> int:
    """Object members in a fixed order, optional ones skippable, separators only between
    present members: ("props", ((member, required), ...), sep, tail_if_none, tail_if_some).
    Two tracks of states (nothing emitted yet / something emitted) keep it linear in size."""
    _, members, sep, tail_none, tail_some = node
    none_track, some_track = start, None
    for member, required in members:
        nxt_some = nfa.new_state()
        if none_track is not None:
            nfa.add_eps(_build(nfa, member, none_track), nxt_some)
        if some_track is not None:
            nfa.add_eps(_build(nfa, ra.seq(sep, member), some_track), nxt_some)
            if not required:
                nfa.add_eps(some_track, nxt_some)
        nxt_none = None
        if none_track is not None and not required:
            nxt_none = nfa.new_state()
            nfa.add_eps(none_track, nxt_none)
        none_track, some_track = nxt_none, nxt_some
    end = nfa.new_state()
    shared = ra.props_shared_tail(node) if some_track is not None else None
    if none_track is not None and shared is not None:
        prefix, optional = shared       # the first extra, then the some-track's tail
        nfa.add_eps(_build(nfa, prefix, none_track), some_track)
        if optional:
            nfa.add_eps(none_track, end)
    elif none_track is not None:
        nfa.add_eps(_build(nfa, tail_none, none_track), end)
    if some_track is not None:
        nfa.add_eps(_build(nfa, tail_some, some_track), end)
    return end


MAX_MULTIPLE = 10_000


def _build_multiple(nfa: NFA, m: int, p: int, start: int) -> int:
    """Unsigned decimals x (no exponent, no leading zeros) with x * 10**p divisible by m:
    states track the value mod m of the digits read, then of the first p fraction digits;
    further fraction digits must be 0."""
    if m > MAX_MULTIPLE:
        raise ConstraintError(f"multipleOf step too large to enforce (residues above {MAX_MULTIPLE})")
    nfa.may_dead_end = True
    end = nfa.new_state()
    integer = [nfa.new_state() for _ in range(m)]          # residue after >= 1 integer digit
    zero = nfa.new_state()                                  # the integer part "0"
    nfa.add_edge(start, 0x30, 0x30, zero)
    for d in range(1, 10):
        nfa.add_edge(start, 0x30 + d, 0x30 + d, integer[d % m])
    for r in range(m):
        for d in range(10):
            nfa.add_edge(integer[r], 0x30 + d, 0x30 + d, integer[(r * 10 + d) % m])
    fraction = [[nfa.new_state() for _ in range(m)] for _ in range(p + 1)]   # [digits read][residue]
    tail_zeros = nfa.new_state()
    for r, state in [(0, zero)] + list(enumerate(integer)):
        if (r * 10 ** p) % m == 0:
            nfa.add_eps(state, end)
        if p > 0:
            dot = nfa.new_state()
            nfa.add_edge(state, 0x2E, 0x2E, dot)
            for d in range(10):
                nfa.add_edge(dot, 0x30 + d, 0x30 + d, fraction[1][(r * 10 + d) % m])
        elif r == 0:
            nfa.add_edge(state, 0x2E, 0x2E, tail_zeros_first := nfa.new_state())
            nfa.add_edge(tail_zeros_first, 0x30, 0x30, tail_zeros)
    for j in range(1, p + 1):
        for r in range(m):
            state = fraction[j][r]
            if (r * 10 ** (p - j)) % m == 0:
                nfa.add_eps(state, end)
            if j < p:
                for d in range(10):
                    nfa.add_edge(state, 0x30 + d, 0x30 + d, fraction[j + 1][(r * 10 + d) % m])
            elif r == 0:
                nfa.add_edge(state, 0x30, 0x30, tail_zeros)
    nfa.add_edge(tail_zeros, 0x30, 0x30, tail_zeros)
    nfa.add_eps(tail_zeros, end)
    return end


def _native_context() -> tuple:
    """What the compiled builder (native.CORE.build_nfa / build_nfa_node / nfa_size) shares
    with the Python one: the caches it reads and fills, the helpers it calls for the kinds
    it does not build itself, and the thresholds, read at each call (tests replace them).
    The order is the C side's (_native_build.c)."""
    return (_FRAGMENTS, _SEEN_ONCE, _SIZES, _PASTES,
            _size_python, _paste_again, _record_and_paste, _build_node_python, _build_chars,
            _paste_copies, deadline.check,
            _FRAGMENT_MIN_SIZE, MAX_MINIMIZED_NFA, MINIMIZE_AFTER_PASTES,
            nfa_module.MAX_NFA_STATES)


_DEAD_ROW = np.full(256, DEAD, dtype=np.int32)


def _grown_table(table: np.ndarray, rows: int) -> np.ndarray:
    """int32 [rows, 256]: ``table``'s rows, then rows of UNCOMPUTED; from 4 MB on, in a
    mapping of its own, its pages populated as it is mapped.

    numpy advises huge pages for its arrays past 4 MB, and the heap ranges it advised keep
    the advice when reused: inside the bench's process, the page faults of a 10,000-state
    DFA's table (16 MB; a pattern's minLength 10,000 built one before it was counted,
    ``product._UnitCounter``) then cost 0.23-0.26 s of CPU (the kernel compacting memory for
    huge pages), 0.04-0.07 s in a fresh mapping, 3 ms in a fresh process. Populating the
    mapping at once (MAP_POPULATE) takes half the CPU time of faulting its pages in one by
    one as they are written (an 8 MB table grown from 4 MB: 5.4 against 11.2 ms), and only
    the new rows are written UNCOMPUTED, the old ones once, by the copy."""
    size = rows * 256 * 4
    kept = len(table)
    if size < _OWN_MAPPING_BYTES:
        grown = np.empty((rows, 256), dtype=np.int32)
    else:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        grown = np.frombuffer(mmap.mmap(-1, size, flags=flags), dtype=np.int32).reshape(rows, 256)
    grown[:kept] = table
    grown[kept:] = UNCOMPUTED
    return grown


_OWN_MAPPING_BYTES = 1 << 22


class _NativeSets:
    """``LazyDFA.sets`` over the compiled index: state -> its NFA set (a tuple, made on each
    access). Its length is the states made known (``accepting``'s length)."""

    __slots__ = ("_rows", "_accepting")

    def __init__(self, rows, accepting: list):
        self._rows, self._accepting = rows, accepting

    def __len__(self) -> int:
        return len(self._accepting)

    def __getitem__(self, state):
        if isinstance(state, slice):
            return [self._rows.set_of(s) for s in range(*state.indices(len(self)))]
        size = len(self)
        if state < 0:
            state += size
        if not 0 <= state < size:
            raise IndexError(f"no DFA state {state}")
        return self._rows.set_of(state)

    def __iter__(self):
        set_of = self._rows.set_of
        return (set_of(s) for s in range(len(self)))

    def __eq__(self, other) -> bool:
        try:
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        except TypeError:
            return NotImplemented

    __hash__ = None


class LazyDFA:
    """Subset construction on demand. Thread-safe: rows are built under a lock."""

    def __init__(self, node, allow_empty_language: bool = False):
        nfa, nfa_start, nfa_accept = build_nfa(node)
        self._setup(nfa, nfa_accept)
        self.start = self._state_at(nfa_start)
        if self.start == DEAD and not allow_empty_language:
            raise ConstraintError("the constraint matches no string at all")

    @classmethod
    def from_nfa(cls, nfa: NFA, nfa_accept: int) -> "LazyDFA":
        """A DFA over an NFA built elsewhere (another process). It has no start state: its
        states are added by ``state_of_set``, named by the NFA state sets of the DFA they
        come from (each process numbers its DFA states in its own visit order)."""
        dfa = cls.__new__(cls)
        dfa._setup(nfa, nfa_accept)
        dfa.start = DEAD
        return dfa

    def start_at(self, nfa_state: int) -> int:
        """The state reached from ``nfa_state`` without input (added if new)."""
        with self._lock:
            return self._state_at(nfa_state)

    def state_of_set(self, nfa_set: tuple) -> int:
        """The state whose NFA state set is ``nfa_set`` (``self.sets[state]``, a sorted
        tuple), added if new."""
        with self._lock:
            return self._state_of(nfa_set)

    def _setup(self, nfa: NFA, nfa_accept: int) -> None:
        nfa.seal()
        self.nfa, self.nfa_accept = nfa, nfa_accept
        self._classes = nfa.byte_classes()          # each byte's class, as bytes
        self._class_edges: dict[int, list] = {}     # NFA state -> edges over classes (lazy)
        self._closures: dict[int, tuple] = {}
        self._lock = threading.RLock()
        self.accepting: list[bool] = []
        core = native.CORE
        self._native_rows = None               # native.CORE.NFARows: rows and the set index
        if core is not None:
            self._native_rows = core.NFARows(
                nfa.edge_start, nfa.edge_lo, nfa.edge_hi, nfa.edge_to, nfa.eps_start,
                nfa.eps_to, self._classes, nfa_accept)
            self.sets = _NativeSets(self._native_rows, self.accepting)
        else:
            self.sets: list[tuple] = []        # state -> its NFA states, sorted
            self._index: dict[tuple, int] = {}     # set -> state (the core's index otherwise)
        self._accepting_flags = np.zeros(64, dtype=bool)     # as accepting, grown with trans
        self.chains: dict = {}         # state -> token_walk.Chain | None (cache of token_walk)
        self.trans = np.full((64, 256), UNCOMPUTED, dtype=np.int32)

    # ---- public --------------------------------------------------------------------------
    @property
    def num_states(self) -> int:
        return len(self.sets)

    def row(self, state: int) -> np.ndarray:
        if state == DEAD:
            return _DEAD_ROW
        trans = self.trans
        if trans[state, 0] == UNCOMPUTED:
            with self._lock:
                if self.trans[state, 0] == UNCOMPUTED:
                    self._build_row(state)
            trans = self.trans
        return trans[state]

    def ensure_rows(self, states: np.ndarray) -> np.ndarray:
        """Builds rows for every state in ``states``; returns the (possibly regrown) table."""
        missing = self.trans[states, 0] == UNCOMPUTED
        if missing.any():
            for s in np.unique(states[missing]).tolist():
                self.row(s)
        return self.trans

    def accepting_array(self) -> np.ndarray:
        """bool[num_states]: accepting flags as an array (a read-only view, kept as states
        are added: no copy of the list per call)."""
        num_states = len(self.sets)        # first: the flags are written before a state is added
        found = self._accepting_flags[:num_states]
        found.flags.writeable = False
        return found

    def walk(self, state: int, data: bytes) -> int:
        """State after reading ``data`` from ``state``; DEAD if the bytes leave the language."""
        for b in data:
            state = int(self.row(state)[b])
            if state < 0:
                return DEAD
        return state

    def is_accepting(self, state: int) -> bool:
        return state != DEAD and self.accepting[state]

    def can_continue(self, state: int) -> bool:
        return bool((self.row(state) >= 0).any())

    def forced_byte(self, state: int) -> int | None:
        """The only byte that can follow ``state``, or None if zero or several can."""
        live = np.flatnonzero(self.row(state) >= 0)
        return int(live[0]) if len(live) == 1 else None

    # ---- construction --------------------------------------------------------------------
    def _state_at(self, nfa_state: int) -> int:
        """The state named by the closure of ``nfa_state``, added if new (lock held)."""
        rows = self._native_rows
        if rows is None:
            return self._state_of(self._closure((nfa_state,)))
        before = len(self.accepting)
        sid = rows.state_at(nfa_state)
        if sid >= before:
            self._added(before, rows.num_states)
        return sid

    def _closure(self, states) -> tuple:
        """The important NFA states reachable from ``states`` without input, as a sorted
        tuple: a DFA state's name. (Tuples of ints drop out of the garbage collector's
        tracking; frozensets never do, and a large grammar's DFAs hold ~100,000 of them.)"""
        out: set[int] = set()
        for q in states:
            cached = self._closures.get(q)
            if cached is None:
                cached = self._closure_of(q)
                self._closures[q] = cached
            out.update(cached)
        return tuple(sorted(out))

    def _closure_of(self, q: int) -> tuple:
        nfa = self.nfa
        seen, stack, important = {q}, [q], set()
        while stack:
            p = stack.pop()
            if nfa.has_edges(p) or p == self.nfa_accept:
                important.add(p)
            for t in nfa.eps_of(p):
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return tuple(important)

    def _state_of(self, nfa_set: tuple, accepting: bool | None = None) -> int:
        """The state named ``nfa_set``, added if new (``accepting``: whether the set holds
        the accept state, when the caller knows)."""
        if not nfa_set:
            return DEAD
        rows = self._native_rows
        if rows is not None:
            before = len(self.accepting)
            sid = rows.state_of(nfa_set)
            if sid >= before:
                self._added(before, rows.num_states)
            return sid
        found = self._index.get(nfa_set)
        if found is not None:
            return found
        sid = len(self.sets)
        if sid >= len(self.trans):
            self._grow(sid + 1)
        if accepting is None:
            accepting = self.nfa_accept in nfa_set
        self._accepting_flags[sid] = accepting
        self.accepting.append(accepting)
        self.sets.append(nfa_set)
        self._index[nfa_set] = sid
        return sid

    def _grow(self, num_states: int) -> None:
        """Room in ``trans`` and the flags for ``num_states`` states (doubling)."""
        size = len(self.trans)
        while size < num_states:
            size *= 2
        if size == len(self.trans):
            return
        known = len(self.accepting)
        self.trans = _grown_table(self.trans, size)
        flags = np.zeros(size, dtype=bool)
        flags[:known] = self._accepting_flags[:known]
        self._accepting_flags = flags

    def _added(self, before: int, num_states: int) -> None:
        """States ``before .. num_states - 1``, added to the compiled index, made known:
        their rows and flags (flags first, then ``accepting``: its length is the count)."""
        if num_states > len(self.trans):
            self._grow(num_states)
        flags = np.frombuffer(self._native_rows.accepting_flags(before, num_states), dtype=bool)
        self._accepting_flags[before:num_states] = flags
        self.accepting.extend(flags.tolist())

    def _edges_in_classes(self, q: int) -> list:
        found = self._class_edges.get(q)
        if found is None:
            cls = self._classes
            found = tuple((cls[lo], cls[hi], t) for lo, hi, t in self.nfa.edges_of(q))
            self._class_edges[q] = found
        return found

    def _build_row(self, state: int) -> None:
        rows = self._native_rows
        if rows is None:
            self._build_row_python(state)
            return
        # the row, its new targets indexed and their flags and accepting entries written
        num_states = rows.build(state, self.trans, self._accepting_flags, self.accepting)
        known = len(self.accepting)
        if num_states > known:                 # no room in the tables: nothing written
            self._added(known, num_states)
            rows.build(state, self.trans, self._accepting_flags, self.accepting)

    def _build_row_python(self, state: int) -> None:
        buckets: dict[int, set[int]] = {}
        for q in self.sets[state]:
            for clo, chi, t in self._edges_in_classes(q):
                for c in range(clo, chi + 1):
                    buckets.setdefault(c, set()).add(t)
        byte_class = np.frombuffer(self._classes, dtype=np.uint8)
        by_class = np.full(int(byte_class.max()) + 1, DEAD, dtype=np.int32)
        memo: dict[frozenset, int] = {}
        for c, targets in buckets.items():
            key = frozenset(targets)
            if key not in memo:
                memo[key] = self._state_of(self._closure(key))
            by_class[c] = memo[key]
        self.trans[state] = by_class[byte_class]
