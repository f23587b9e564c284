"""A byte-level Thompson NFA kept in flat int arrays.

States are the ints ``0 .. num_states - 1``. While it is built, each byte-range edge is
appended to one flat array as ``q, lo, hi, t`` and each epsilon edge to another as
``q, t``, in any order; ``seal()`` sorts both by source state (offsets per state, as in a
CSR matrix), and from then on ``edges_of(q)`` / ``eps_of(q)`` read one state's edges::

    edge_start  [0, 2, 2, 3, ...]        edges of q: rows edge_start[q] .. edge_start[q+1]
    edge_lo     [0x61, 0x30, 0x22, ...]  edge_hi, edge_to: the same rows
    eps_start / eps_to                   the same for epsilon edges

Why flat: a large constraint's NFA has hundreds of thousands of states, kept alive by its
lazy DFA for as long as the constraint is cached. A list or tuple per state is an object
the garbage collector tracks, and a full collection over a few such NFAs took up to a
second inside a mask fill; ``array('i')`` and numpy arrays are objects it never looks into.
Copying a fragment (``paste``) is one vectorised shift, and a sealed NFA pickles as a few
byte strings (``row_workers``).
"""
from __future__ import annotations

from array import array

import numpy as np

from . import deadline, native
from .errors import ConstraintError

MAX_NFA_STATES = 400_000


def _too_large() -> ConstraintError:
    return ConstraintError(
        f"constraint too large: its automaton exceeds {MAX_NFA_STATES} states "
        "(reduce repetition counts such as maxLength/maxItems or {m,n})")


class NFA:
    """Building: ``new_state``, ``reserve``, ``add_edge``, ``add_eps`` (or a table of them),
    ``paste`` (or a chain of copies); then ``seal`` once; then reading: ``edges_of``,
    ``eps_of``, ``has_edges``, ``byte_classes``.
    ``may_dead_end`` is set by constructs that can leave a state unable to reach the accept
    state (empty classes/alternations, products, residue automata): only then does
    ``seal(accept)`` need to trim."""

    def __init__(self):
        self.num_states = 0
        self.may_dead_end = False
        self.sealed = False
        self._edges = array("i")        # q, lo, hi, t per edge, while building
        self._eps = array("i")          # q, t per epsilon edge, while building

    # ---- building ------------------------------------------------------------------------
    def new_state(self) -> int:
        if self.num_states >= MAX_NFA_STATES:
            raise _too_large()
        if self.num_states & 1023 == 0:
            deadline.check()
        self.num_states += 1
        return self.num_states - 1

    def reserve(self, count: int) -> int:
        """Appends ``count`` fresh states at once; returns the first of them."""
        if self.num_states + count > MAX_NFA_STATES:
            raise _too_large()
        deadline.check()
        first = self.num_states
        self.num_states += count
        return first

    def add_edge(self, q: int, lo: int, hi: int, t: int) -> None:
        self._edges.extend((q, lo, hi, t))

    def add_eps(self, q: int, t: int) -> None:
        self._eps.extend((q, t))

    def add_edge_table(self, edges: np.ndarray) -> None:
        """Adds the edges of an int [n, 4] array of (q, lo, hi, t) rows at once."""
        self._edges.frombytes(np.ascontiguousarray(edges, dtype=np.int32).tobytes())

    def add_eps_table(self, eps: np.ndarray) -> None:
        """Adds the epsilon edges of an int [n, 2] array of (q, t) rows at once."""
        self._eps.frombytes(np.ascontiguousarray(eps, dtype=np.int32).tobytes())

    def paste(self, fragment: "NFA", start: int, end: int) -> int:
        """Copies the sealed ``fragment``: its state 0 becomes ``start``, its other states
        are appended; returns where its state ``end`` went."""
        assert fragment.sealed and not self.sealed
        self.may_dead_end |= fragment.may_dead_end
        offset = self.reserve(fragment.num_states - 1) - 1
        core = native.CORE
        for table, columns, out in ((fragment.edge_table, _EDGE_COLUMNS, self._edges),
                                    (fragment.eps_table, _EPS_COLUMNS, self._eps)):
            if core is not None:       # a fragment is small: numpy's calls cost more than it
                out.frombytes(core.shifted_states(table, columns, offset, start))
            else:
                out.frombytes(_shifted_python(fragment, table, offset, start))
        return start if end == 0 else end + offset

    def paste_chain(self, fragment: "NFA", start: int, end: int, count: int,
                    exit: int | None = None) -> int:
        """``paste`` ``count`` times, each copy from where the one before ended, in one
        vectorised step; with ``exit``, first an epsilon edge from each copy's start to
        ``exit`` (the optional copies of a counted repetition). The same states and edges,
        in the same order, as the pastes (and ``add_eps``) one by one."""
        assert fragment.sealed and not self.sealed
        self.may_dead_end |= fragment.may_dead_end
        size = fragment.num_states - 1
        offsets = self.reserve(size * count) - 1 + size * np.arange(count, dtype=np.int64)
        starts = np.full(count, start, dtype=np.int64)
        if end != 0:
            starts[1:] = end + offsets[:-1]
        for table, states, at_start, out, exits in (
                (fragment.edge_table, _EDGE_STATES, fragment.edge_at_start, self._edges, False),
                (fragment.eps_table, _EPS_STATES, fragment.eps_at_start, self._eps, exit is not None)):
            copies = np.tile(table.astype(np.int64), (count, 1))
            copies += np.repeat(offsets, len(table))[:, None] * states
            copies = copies.reshape(count, len(table), table.shape[1])
            for column, rows in at_start:
                copies[:, rows, column] = starts[:, None]
            if exits:                   # (start of copy i, exit) before copy i's own edges
                edge = np.stack([starts, np.full(count, exit, dtype=np.int64)], axis=1)
                copies = np.concatenate([edge[:, None, :], copies], axis=1)
            out.frombytes(copies.astype(np.int32).tobytes())
        return start if end == 0 else end + int(offsets[-1])

    def seal(self, accept: int | None = None) -> None:
        """Sorts the edges by source state; with ``accept`` and ``may_dead_end``, first drops
        the edges into states that cannot reach ``accept`` (so that no live DFA state is a
        dead end). Idempotent."""
        if self.sealed:
            return
        edges = np.frombuffer(self._edges, dtype=np.int32).reshape(-1, 4)
        eps = np.frombuffer(self._eps, dtype=np.int32).reshape(-1, 2)
        if accept is not None and self.may_dead_end:
            alive = _reaching(self.num_states, edges, eps, accept)
            # compress, not a boolean index: numpy selects whole rows ten times faster so
            edges = np.compress(alive[edges[:, 3]], edges, axis=0)
            eps = np.compress(alive[eps[:, 1]], eps, axis=0)
        self.edge_table = _by_source(edges, self.num_states)
        self.eps_table = _by_source(eps, self.num_states)
        self._edges = self._eps = None
        self.sealed = True

    def __getattr__(self, name: str):
        """Builds, on first use after ``seal``, the per-state offsets that ``edges_of`` and
        friends read, or the positions of state 0 that ``paste`` rewrites: an automaton's NFA
        is only read and a fragment only pasted, and most NFAs are small fragments."""
        if not self.__dict__.get("sealed"):
            raise AttributeError(name)
        if name in _READ_ARRAYS:
            core = native.CORE
            read = core.read_arrays if core is not None else _read_arrays_python
            (self.edge_start, self.edge_lo, self.edge_hi, self.edge_to, self.eps_start,
             self.eps_to) = map(_ints, read(self.edge_table, self.eps_table, self.num_states))
        elif name in _PASTE_ROWS:
            self.edge_at_start = _rows_at_start(self.edge_table, (0, 3))
            self.eps_at_start = _rows_at_start(self.eps_table, (0, 1))
        else:
            raise AttributeError(name)
        return self.__dict__[name]

    # ---- reading (sealed) ----------------------------------------------------------------
    def edges_of(self, q: int) -> tuple:
        """((lo, hi, target), ...) of state ``q``."""
        a, b = self.edge_start[q], self.edge_start[q + 1]
        return tuple(zip(self.edge_lo[a:b], self.edge_hi[a:b], self.edge_to[a:b]))

    def eps_of(self, q: int) -> array:
        return self.eps_to[self.eps_start[q]:self.eps_start[q + 1]]

    def has_edges(self, q: int) -> bool:
        return self.edge_start[q + 1] > self.edge_start[q]

    def byte_classes(self) -> bytes:
        """Partitions 0..255 into classes no edge splits: each byte's class (0, 1, ...)."""
        core = native.CORE
        return (core.byte_classes if core is not None else _byte_classes_python)(self.edge_table)


_READ_ARRAYS = frozenset({"edge_start", "edge_lo", "edge_hi", "edge_to", "eps_start", "eps_to"})
_PASTE_ROWS = frozenset({"edge_at_start", "eps_at_start"})     # (column, rows) holding state 0
_EDGE_STATES = np.array([1, 0, 0, 1], dtype=np.int32)     # which columns hold states
_EPS_STATES = np.array([1, 1], dtype=np.int32)
_EDGE_COLUMNS, _EPS_COLUMNS = (sum(1 << int(c) for c in np.flatnonzero(states))  # as bits:
                                for states in (_EDGE_STATES, _EPS_STATES))         # column c, bit c


def _shifted_python(fragment: NFA, table: np.ndarray, offset: int, start: int) -> bytes:
    """The rows of ``table`` (``fragment``'s edge or epsilon table) as ``paste`` writes them:
    state 0 becomes ``start``, every other state s becomes s + offset (the compiled core's
    ``shifted_states``, its reference)."""
    if table is fragment.edge_table:
        states, at_start = _EDGE_STATES, fragment.edge_at_start
    else:
        states, at_start = _EPS_STATES, fragment.eps_at_start
    shifted = table + states * offset
    for column, rows in at_start:
        shifted[rows, column] = start
    return shifted.tobytes()


def _ints(data: bytes) -> array:
    return array("i", data)


def _read_arrays_python(edge_table: np.ndarray, eps_table: np.ndarray, num_states: int) -> tuple:
    """(edge_start, edge_lo, edge_hi, edge_to, eps_start, eps_to) as int32 bytes: the
    per-state offsets into the sealed tables and their columns (the compiled core's
    ``read_arrays``, its reference)."""
    return (_starts(edge_table[:, 0], num_states).tobytes(),
            *(edge_table[:, c].tobytes() for c in (1, 2, 3)),
            _starts(eps_table[:, 0], num_states).tobytes(), eps_table[:, 1].tobytes())


def _byte_classes_python(edge_table: np.ndarray) -> bytes:
    """Each byte's class, 256 bytes (the compiled core's ``byte_classes``, its reference)."""
    # a class starts at byte 0 and at every edge's lo and hi + 1: marked in a table of
    # 257 flags (no sort of the edges' bounds, which number 2 per edge)
    starts = np.zeros(257, dtype=bool)
    starts[0] = True
    starts[edge_table[:, 1]] = True
    starts[edge_table[:, 2] + 1] = True
    return (np.cumsum(starts[:256], dtype=np.int64) - 1).astype(np.uint8).tobytes()


def _rows_at_start(table: np.ndarray, columns: tuple) -> list:
    found = [(c, np.flatnonzero(table[:, c] == 0)) for c in columns]
    return [(c, rows) for c, rows in found if len(rows)]


def _by_source(table: np.ndarray, num_states: int) -> np.ndarray:
    """The rows of ``table`` sorted by source state, stably (in the compiled core when it
    is built: a counting sort, where numpy's sort and gather cost more than most tables)."""
    core = native.CORE
    if core is None:
        return _by_source_python(table)
    data = core.sorted_by_source(np.ascontiguousarray(table, dtype=np.int32), num_states)
    return np.frombuffer(data, dtype=np.int32).reshape(table.shape)


def _by_source_python(table: np.ndarray) -> np.ndarray:
    # take, not a fancy index: numpy gathers whole rows ten times faster so
    order = np.argsort(table[:, 0], kind="stable")
    return np.ascontiguousarray(np.take(table, order, axis=0), dtype=np.int32)


def _starts(sources: np.ndarray, num_states: int) -> array:
    """Offsets per state (``num_states + 1`` of them) into rows sorted by source: the
    running count of rows per state (linear, where a search per state was n log n)."""
    starts = np.zeros(num_states + 1, dtype=np.int32)
    np.cumsum(np.bincount(sources, minlength=num_states)[:num_states], out=starts[1:])
    return array("i", starts.tobytes())


def _reaching(num_states: int, edges: np.ndarray, eps: np.ndarray, accept: int) -> np.ndarray:
    """bool[num_states]: the states with a path (over any edges) to ``accept`` (in the
    compiled core when it is built)."""
    sources = np.concatenate((edges[:, 0], eps[:, 0]))
    targets = np.concatenate((edges[:, 3], eps[:, 1]))
    core = native.CORE
    if core is None:
        return _reaching_python(num_states, sources, targets, accept)
    return np.frombuffer(core.reaching(num_states, sources, targets, accept), dtype=np.bool_)


def _reaching_python(num_states: int, sources: np.ndarray, targets: np.ndarray,
                     accept: int) -> np.ndarray:
    """``_reaching`` over the edges sources[i] -> targets[i]: the compiled core's reference."""
    order = np.argsort(targets, kind="stable")
    preds = sources[order].tolist()
    start = _starts(targets[order], num_states).tolist()
    alive = bytearray(num_states)
    alive[accept] = 1
    stack = [accept]
    while stack:
        q = stack.pop()
        for p in preds[start[q]:start[q + 1]]:
            if not alive[p]:
                alive[p] = 1
                stack.append(p)
    return np.frombuffer(bytes(alive), dtype=np.uint8).astype(bool)
