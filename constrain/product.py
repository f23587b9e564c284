"""Intersection ("and") and difference ("diff") of two regular languages, embedded in an NFA
as an explicit product automaton.

The product is explored over *characters* where it can be: every code-point set of both
operands is cut into classes no set splits, each class renamed to one ASCII pseudo-character,
and the two renamed operands' DFAs are walked in step. A class then costs one edge per product
state instead of one per byte, and a state inside a multi-byte character is no product state
at all: ``(\\S+\\s+){0,49}\\S+`` within 256 characters is ~20,000 character states, where
its byte product passes 400,000. Each character edge is written back as UTF-8 byte ranges
through intermediate states shared by every edge into the same target with the same
remaining bytes. Operands holding more than ``MAX_CLASSES`` classes, or nodes other than
chars/seq/alt/rep/and/diff, are multiplied byte by byte, runs of bytes with the same target
pair merged into one range edge.

Both are exact: the product accepts the strings of ``a`` that are (``and``) or are not
(``diff``) strings of ``b``.

A right operand ``rep(unit, lo, hi)`` is a count of units beside the unit's own small
automaton (``_UnitCounter``) where the units of a string can be told apart one way: a JSON
string's ``minLength`` 10,000 under a ``pattern`` counts units of escaped content (a
character or an escape sequence), and is no 10,001-state DFA then.

The reachable pairs and their runs are found first (``_explore``: in the compiled core,
``native.CORE.product_runs``, when it is built and no length of characters is counted; its
reference is ``_explore_python``), then written into the NFA at once: a state per pair,
numbered as found, then the intermediate states of multi-byte characters. Either way the same
NFA results.
"""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from . import deadline, native
from . import regex_ast as ra
from .automaton import DEAD, LazyDFA, NFA
from .errors import ConstraintError
from .utf8 import utf8_sequences

MAX_PRODUCT_STATES = 100_000
MAX_CLASSES = 128              # pseudo-characters must be single UTF-8 bytes (ASCII)
_DEAD_ROW = np.full(256, DEAD, dtype=np.int32)


def build_product(nfa: NFA, a, b, start: int, mode: str) -> int:
    """Adds to ``nfa`` a path from ``start`` to the returned end state for each string of
    ``a`` in (``mode`` "and") or not in ("diff") the language of ``b``."""
    nfa.may_dead_end = True
    alphabet = None if mode == "diff" and _is_finite(b) else _char_classes(a, b)
    if alphabet is None:
        return _ProductBuilder(nfa, a, b, mode, None).build(start)
    classes, ids_of = alphabet
    memo: dict = {}
    return _ProductBuilder(nfa, _renamed(a, ids_of, memo), _renamed(b, ids_of, memo),
                           mode, classes).build(start)


def _is_finite(node) -> bool:
    """Whether ``node`` is built of chars, seq and alt alone: a finite set of strings. A
    difference with one (an object's extra keys: any key less the declared names' spellings)
    is walked over bytes: renamed operands are new nodes in every product, so the subtracted
    strings' automaton would be built again, node by node, where over bytes it is pasted
    from the fragments of the nodes every schema shares (a name's spellings); and a finite
    right side adds few pairs inside multi-byte characters."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node[0] not in ("chars", "seq", "alt"):
            return False
        if node[0] != "chars":
            stack.extend(node[1])
    return True


def _length_bound(node):
    """(character set, lo, hi) when ``node`` is ``rep(chars, lo, hi)`` with a finite hi."""
    if node[0] == "rep" and node[1][0] == "chars" and node[3] is not None:
        return node[1][1], node[2], node[3]
    return None


class _ProductBuilder:
    """Walks the reachable pairs of the operands' DFAs; ``classes`` (code-point ranges of
    pseudo-character i) when the operands were renamed, None for bytes."""

    def __init__(self, nfa: NFA, a, b, mode: str, classes):
        self.nfa, self.diff, self.classes = nfa, mode == "diff", classes
        self.left = LazyDFA(a, allow_empty_language=True)
        self.alphabet = alphabet = 256 if classes is None else len(classes)
        bound = _length_bound(b) if classes is not None and mode == "and" else None
        counter = _UnitCounter.of(b, alphabet) if bound is None and mode == "and" else None
        self.settle, self.counter = None, counter
        if bound is not None:
            self.right = _LengthCounter(self.left, alphabet, *bound)
            self.settle = self.right.settle
        else:
            self.right = counter or LazyDFA(b, allow_empty_language=True)
        self.left_runs: dict[int, list] = {}   # left state -> its runs (of counted symbols)
        self.right_runs: dict[int, list] = {}  # right state -> its runs
        self.paths: dict = {}          # pseudo-characters -> their UTF-8 byte-range paths

    def build(self, start: int) -> int:
        """Writes the product into the NFA: one state per reachable pair (pair i is state
        ``first + i``), then the intermediate states of multi-byte characters."""
        nfa, left = self.nfa, self.left
        end = nfa.new_state()
        if left.start == DEAD:
            return end                  # empty language: nothing reaches the end
        accepting, runs = self._explore(self.alphabet)
        first = nfa.reserve(len(accepting))
        nfa.add_eps(start, first)
        finals = np.flatnonzero(accepting).astype(np.int32) + first
        nfa.add_eps_table(np.stack([finals, np.full(len(finals), end, dtype=np.int32)], axis=1))
        states = runs[:, [0, 3]] + first
        if self.classes is None:
            nfa.add_edge_table(np.stack([states[:, 0], runs[:, 1], runs[:, 2], states[:, 1]], axis=1))
        else:
            self._char_edges(states[:, 0], runs[:, 1], runs[:, 2], states[:, 1])
        return end

    # ---- the reachable pairs ---------------------------------------------------------------
    def _explore(self, alphabet: int) -> tuple[np.ndarray, np.ndarray]:
        """(bool per pair: accepting, int32 [runs, 4]: pair, lo, hi, target pair) of the
        pairs reachable from the start pair (id 0), numbered as found, a pair expanded
        last-found first. The compiled core walks two DFAs, or a DFA and a count of units,
        alike (a count of characters, ``settle``, in Python only)."""
        core = native.CORE
        if core is None or self.settle is not None:
            _, accepting, runs = self._explore_python(alphabet)
            return accepting, runs
        found = self.core_runs(core, alphabet)
        if found is None:
            raise _too_many_pairs()
        _, accepting, runs = found
        return (np.frombuffer(accepting, dtype=np.bool_),
                np.frombuffer(runs, dtype=np.int32).reshape(-1, 4))

    def core_runs(self, core, alphabet: int):
        """``core.product_runs`` of the operands: (pairs, accepting, runs) as bytes, None
        past ``MAX_PRODUCT_STATES``."""
        counter = self.counter
        return core.product_runs(self.left, None if counter else self.right, self.left.start,
                                 self.right.start, alphabet, self.diff, MAX_PRODUCT_STATES,
                                 deadline.check, counter and counter.core_args())

    def _explore_python(self, alphabet: int) -> tuple[list, np.ndarray, np.ndarray]:
        """``_explore`` in Python, with the pairs themselves: the compiled core's reference."""
        left, right = self.left, self.right
        ids: dict[tuple[int, int], int] = {}
        pairs: list[tuple[int, int]] = []
        runs: list[int] = []

        def pair_id(pair: tuple[int, int]) -> int:
            found = ids.get(pair)
            if found is None:
                if len(ids) >= MAX_PRODUCT_STATES:
                    raise _too_many_pairs()
                if len(ids) & 1023 == 0:
                    deadline.check()
                found = ids[pair] = len(pairs)
                pairs.append(pair)
                queue.append(pair)
            return found
        queue: list[tuple[int, int]] = []
        pair_id((left.start, right.start))
        accepting = []
        while queue:
            pair = queue.pop()
            here = ids[pair]
            in_right = pair[1] != DEAD and right.is_accepting(pair[1])
            accepting.append((here, left.is_accepting(pair[0]) and in_right != self.diff))
            for lo, hi, target in self._pair_runs(pair, alphabet):
                runs += (here, lo, hi, pair_id(target))
        flags = np.zeros(len(pairs), dtype=np.bool_)
        for here, flag in accepting:
            flags[here] = flag
        return pairs, flags, np.array(runs, dtype=np.int32).reshape(-1, 4)

    def _pair_runs(self, pair: tuple[int, int], alphabet: int) -> list:
        """(lo, hi, target pair) of each run of symbols leaving ``pair``. Against a length
        counter every counted symbol moves the count alike: the runs are those of the left
        state (kept per left state), each moving to the next count."""
        left, right = self.left, self.right
        if self.settle is None:
            return _merged_runs(self._state_runs(left, self.left_runs, pair[0], alphabet),
                                self._state_runs(right, self.right_runs, pair[1], alphabet),
                                self.diff)
        nxt = right.next(pair[1])
        if nxt == DEAD:
            return []
        runs = self.left_runs.get(pair[0])
        if runs is None:
            runs = self.left_runs[pair[0]] = [
                (lo, hi, target[0]) for lo, hi, target in
                _runs(left.row(pair[0])[:alphabet], right.counted, False)]
        return [(lo, hi, self.settle((target, nxt))) for lo, hi, target in runs]

    @staticmethod
    def _state_runs(dfa: LazyDFA, cache: dict, state: int, alphabet: int) -> list:
        """(lo, hi, target) of each run of symbols with one target (DEAD ones included) in
        ``state``'s row, cached: a state of either side is met in many pairs."""
        runs = cache.get(state)
        if runs is None:
            row = (dfa.row(state) if state != DEAD else _DEAD_ROW)[:alphabet]
            runs = cache[state] = _runs_of_row(row)
        return runs

    # ---- characters as UTF-8 ---------------------------------------------------------------
    def _char_edges(self, here: np.ndarray, first: np.ndarray, last: np.ndarray,
                    target: np.ndarray) -> None:
        """Edges from ``here[i]`` to ``target[i]`` reading one character of the classes
        ``first[i]`` to ``last[i]``, for every i: a character's first byte from ``here``,
        its other bytes through intermediate states shared by every edge into the same
        target with the same byte ranges left to read."""
        keys = first.astype(np.int64) * 256 + last
        distinct, inverse = np.unique(keys, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        groups = np.split(order, np.cumsum(np.bincount(inverse, minlength=len(distinct)))[:-1])
        direct, through = [], []         # through: (here, lo, hi, remaining ranges, targets)
        for key, rows in zip(distinct.tolist(), groups):
            for lo, hi, rest in self._paths(key >> 8, key & 255):
                block = (here[rows], lo, hi, rest, target[rows])
                (through if rest else direct).append(block)
        hops = self._hops([(rest, targets) for _, _, _, rest, targets in through])
        edges = [_edge_block(src, lo, hi, dst) for src, lo, hi, _, dst in direct]
        edges += [_edge_block(src, lo, hi, hops.state(rest, dst)) for src, lo, hi, rest, dst in through]
        edges += hops.edges
        if edges:
            self.nfa.add_edge_table(np.concatenate(edges))

    def _paths(self, first: int, last: int) -> list:
        """(lo, hi, remaining byte ranges) of the UTF-8 paths of the classes first..last."""
        paths = self.paths.get((first, last))
        if paths is None:
            ranges = _merged_ranges(self.classes[first:last + 1])
            paths = self.paths[(first, last)] = [
                (path[0][0], path[0][1], path[1:])
                for lo, hi in ranges for path in utf8_sequences(lo, hi)]
        return paths

    def _hops(self, wanted: list) -> "_Hops":
        """The intermediate states for (remaining byte ranges, targets) in ``wanted``: the
        state from which ranges ``rest`` lead to target t, for each t, and so for every
        shorter tail of ``rest``, which the longer ones lead into."""
        targets_of: dict[tuple, list] = {}
        for rest, targets in wanted:
            for k in range(len(rest)):
                targets_of.setdefault(rest[k:], []).append(targets)
        hops = _Hops()
        for rest in sorted(targets_of, key=lambda r: (len(r), r)):   # tails first
            targets = np.unique(np.concatenate(targets_of[rest]))
            states = np.arange(len(targets), dtype=np.int32) + self.nfa.reserve(len(targets))
            hops.at[rest] = (targets, states)
            after = targets if len(rest) == 1 else hops.state(rest[1:], targets)
            hops.edges.append(_edge_block(states, rest[0][0], rest[0][1], after))
        return hops


class _Hops:
    """Intermediate states of multi-byte characters: per remaining byte ranges, the sorted
    targets and the state leading to each; and their edges."""

    def __init__(self):
        self.at: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.edges: list[np.ndarray] = []

    def state(self, rest: tuple, targets: np.ndarray) -> np.ndarray:
        known, states = self.at[rest]
        return states[np.searchsorted(known, targets)]


def _merged_ranges(classes: list) -> list:
    """The code-point ranges of several classes, sorted and merged: ``ra.normalize_ranges``
    for classes, which are normalized already and disjoint."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(r for ranges in classes for r in ranges):
        if merged and lo == merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


def _edge_block(sources: np.ndarray, lo: int, hi: int, targets: np.ndarray) -> np.ndarray:
    """int32 [n, 4] edges (source, lo, hi, target)."""
    block = np.empty((len(sources), 4), dtype=np.int32)
    block[:, 0], block[:, 1], block[:, 2], block[:, 3] = sources, lo, hi, targets
    return block


def _too_many_pairs() -> ConstraintError:
    return ConstraintError("constraint too large: the intersection of two "
                           "sub-expressions (e.g. pattern and maxLength) is too big")


class _LengthCounter:
    """The right side of ``a`` and ``rep(chars, lo, hi)`` over pseudo-characters: state n =
    n characters read, and ``FREE`` once the bound can no longer fail, that is once n >= lo
    and no string left in ``a``'s state is longer than hi - n or holds another character
    (then the pair keeps only ``a``'s state: the product stops counting where the count no
    longer matters, e.g. inside the bounded tail of an e-mail address)."""

    def __init__(self, left: LazyDFA, alphabet: int, allowed, lo: int, hi: int):
        self.lo, self.hi, self.start = lo, hi, 0
        self.free = hi + 1
        self.allowed = np.zeros(alphabet, dtype=bool)
        for a, b in allowed:
            self.allowed[a:b + 1] = True
        self.counted = np.where(self.allowed, 0, DEAD).astype(np.int32)   # one row for every n
        self.longest = _longest_suffixes(left, alphabet, self.allowed)

    def is_accepting(self, n: int) -> bool:
        return n == self.free or self.lo <= n <= self.hi

    def next(self, n: int) -> int:
        """The count after one more counted symbol (DEAD past hi)."""
        return self.free if n == self.free else n + 1 if n < self.hi else DEAD

    def settle(self, pair: tuple[int, int]) -> tuple[int, int]:
        state, n = pair
        longest = self.longest.get(state)
        if n != self.free and longest is not None and n >= self.lo and n + longest <= self.hi:
            return state, self.free
        return pair


MAX_UNIT_STATES = 64
# Below this many units the repetition's own DFA is as small, and is kept: trying a unit
# builds its DFA, which records its fragment for later builds.
MIN_COUNTED_UNITS = 16


class _UnitCounter:
    """The right side of ``a`` and ``rep(unit, lo, hi)`` when ``unit`` holds no empty string
    and no string that begins another (each unit's end is then known where it is read, so
    a string splits into units one way only): state ``n * units + u`` is n units read, then
    the unit's state u, 0 between units. ``rows`` (int32 [units, alphabet]) are the unit's
    transitions: DEAD, a unit state, or ``units`` where a unit ends. The count stops at
    ``cap`` (hi; lo when hi is None): past hi nothing is live, and without hi a unit ending
    at cap stays there. Accepting: between units, with n >= lo."""

    start = 0

    def __init__(self, rows: np.ndarray, lo: int, cap: int, saturate: bool):
        self.rows, self.lo, self.cap, self.saturate = rows, lo, cap, saturate
        self.units = len(rows)

    @classmethod
    def of(cls, node, alphabet: int) -> "_UnitCounter | None":
        """The counter for ``node`` when it is such a repetition; None otherwise."""
        if node[0] != "rep":
            return None
        _, unit, lo, hi = node
        cap = lo if hi is None else hi
        if cap < max(lo, MIN_COUNTED_UNITS) or ra.has_rules(unit) or ra.matches_empty(unit):
            return None
        rows = _unit_rows(unit, alphabet)
        if rows is None or (cap + 1) * len(rows) > np.iinfo(np.int32).max:
            return None
        return cls(rows, lo, cap, hi is None)

    def core_args(self) -> tuple:
        """``native.CORE.product_runs``'s ``counter`` argument."""
        return self.rows, self.lo, self.cap, self.saturate

    def is_accepting(self, state: int) -> bool:
        return state % self.units == 0 and state // self.units >= self.lo

    def row(self, state: int) -> np.ndarray:
        """The transitions of ``state`` over the alphabet, computed."""
        n, u = divmod(state, self.units)
        unit_row = self.rows[u]
        if n == self.cap and not self.saturate:
            return np.full(len(unit_row), DEAD, dtype=np.int32)
        at = n * self.units
        ended = at + self.units if n < self.cap else at
        return np.where(unit_row == DEAD, DEAD,
                        np.where(unit_row == self.units, ended, at + unit_row)).astype(np.int32)


def _unit_rows(unit, alphabet: int) -> np.ndarray | None:
    """``_UnitCounter.rows`` of ``unit``'s DFA: its start (state 0 between units) and the
    states read into a unit, numbered as found; None when a unit may be empty or begin
    another, or past ``MAX_UNIT_STATES``. The start reached inside a unit is a state of its
    own: between units the count may accept, inside one it may not."""
    dfa = LazyDFA(unit, allow_empty_language=True)
    if dfa.start == DEAD or dfa.is_accepting(dfa.start):
        return None
    inside: dict[int, int] = {}           # DFA state -> its unit state, once read into a unit
    order, rows = [dfa.start], []
    for state in order:
        row = dfa.row(state)[:alphabet]
        out = np.full(alphabet, DEAD, dtype=np.int32)
        for target in np.unique(row[row >= 0]).tolist():
            if dfa.is_accepting(target):
                if (dfa.row(target)[:alphabet] >= 0).any():
                    return None           # a unit that begins another
                out[row == target] = -3   # a unit's end, numbered once all are known
                continue
            if target not in inside:
                if len(order) >= MAX_UNIT_STATES:
                    return None
                inside[target] = len(order)
                order.append(target)
            out[row == target] = inside[target]
        rows.append(out)
    table = np.stack(rows)
    table[table == -3] = len(order)
    return table


def _longest_suffixes(dfa: LazyDFA, alphabet: int, allowed: np.ndarray) -> dict[int, int]:
    """For each state of ``dfa`` whose strings (to an accepting state) are all of bounded
    length and use only ``allowed`` symbols: the longest such string's length. States on or
    before a cycle, or with another symbol ahead, are left out (their counts matter)."""
    states, order = {dfa.start}, [dfa.start]
    for state in order:
        if len(order) > MAX_PRODUCT_STATES:
            return {}
        for t in dfa.row(state)[:alphabet].tolist():
            if t >= 0 and t not in states:
                states.add(t)
                order.append(t)
    longest: dict[int, int] = {}
    unbounded: set[int] = set()
    for root in order:
        stack = [(root, False)]
        on_path: set[int] = set()
        while stack:
            state, done = stack.pop()
            if done:
                on_path.discard(state)
                _settle_longest(dfa, state, alphabet, allowed, longest, unbounded)
                continue
            if state in longest or state in unbounded:
                continue
            if state in on_path:
                unbounded.add(state)          # a cycle: strings of any length
                continue
            on_path.add(state)
            stack.append((state, True))
            row = dfa.row(state)[:alphabet]
            stack.extend((int(t), False) for t in np.unique(row[row >= 0]))
    return longest


def _settle_longest(dfa, state, alphabet, allowed, longest, unbounded) -> None:
    row = dfa.row(state)[:alphabet]
    live = row >= 0
    targets = np.unique(row[live]).tolist()
    if (live & ~allowed).any() or state in unbounded or any(t not in longest for t in targets):
        unbounded.add(state)
        longest.pop(state, None)
        return
    longest[state] = max((longest[t] + 1 for t in targets), default=0)


def _runs_of_row(row: np.ndarray) -> list:
    """(lo, hi, target) of each run of symbols with one target in ``row`` (DEAD included)."""
    bounds = [0] + (np.flatnonzero(row[1:] != row[:-1]) + 1).tolist() + [len(row)]
    return list(zip(bounds[:-1], [b - 1 for b in bounds[1:]], row[bounds[:-1]].tolist()))


def _merged_runs(runs_l: list, runs_r: list, diff: bool) -> list:
    """``_runs`` of two rows from each row's own runs (both cover the same symbols): a
    merged run ends where either side's does."""
    out = []
    i = j = lo = 0
    while i < len(runs_l):
        _, hi_l, target_l = runs_l[i]
        _, hi_r, target_r = runs_r[j]
        hi = hi_l if hi_l < hi_r else hi_r
        if target_l >= 0 and (target_r >= 0 or diff):
            out.append((lo, hi, (target_l, target_r)))
        lo = hi + 1
        i += hi == hi_l
        j += hi == hi_r
    return out


def _runs(row_l: np.ndarray, row_r: np.ndarray, diff: bool):
    """(lo, hi, (left target, right target)) for each run of symbols with the same live
    target pair (a dead right side is live in a difference)."""
    live = (row_l >= 0) & ((row_r >= 0) | diff)
    if not live.any():
        return
    change = np.flatnonzero((row_l[1:] != row_l[:-1]) | (row_r[1:] != row_r[:-1])) + 1
    bounds = [0] + change.tolist() + [len(row_l)]
    for lo, stop in zip(bounds, bounds[1:]):
        if live[lo]:
            yield lo, stop - 1, (int(row_l[lo]), int(row_r[lo]))


# ---- the character alphabet ----------------------------------------------------------------
_RENAMED_KINDS = ("chars", "seq", "alt", "rep", "and", "diff")
MAX_INTERVALS = 4096


def _char_classes(a, b) -> tuple[list, dict] | None:
    """(classes, class ids of each character set) for the sets of ``a`` and ``b``: code
    points lie in one class when every set holds both or neither, so no set splits a class;
    None when there are more than ``MAX_CLASSES`` classes or a node kind that cannot be
    renamed."""
    sets = _character_sets(a, b)
    if sets is None:
        return None
    cuts = sorted({lo for ranges in sets for lo, _ in ranges} |
                  {hi + 1 for ranges in sets for _, hi in ranges})
    if len(cuts) > MAX_INTERVALS:
        return None
    members: list[list[int]] = [[] for _ in cuts]      # interval i: [cuts[i], cuts[i + 1])
    for k, ranges in enumerate(sets):
        for lo, hi in ranges:
            for i in range(bisect_left(cuts, lo), bisect_left(cuts, hi + 1)):
                members[i].append(k)
    by_signature: dict[tuple, list] = {}
    for i, held_by in enumerate(members[:-1]):
        if held_by:
            by_signature.setdefault(tuple(held_by), []).append((cuts[i], cuts[i + 1] - 1))
    if len(by_signature) > MAX_CLASSES:
        return None
    classes = [ra.normalize_ranges(ranges) for ranges in by_signature.values()]
    ids_of: dict[tuple, list] = {ranges: [] for ranges in sets}
    for c, signature in enumerate(by_signature):
        for k in signature:
            ids_of[sets[k]].append(c)
    return classes, ids_of


def _character_sets(a, b) -> list | None:
    """The distinct range tuples of the chars nodes under ``a`` and ``b``; None if a node
    kind other than ``_RENAMED_KINDS`` occurs."""
    sets: dict[tuple, None] = {}
    seen: set[int] = set()
    stack = [a, b]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node[0] not in _RENAMED_KINDS:
            return None
        if node[0] == "chars":
            sets[node[1]] = None
        stack.extend(ra.children(node))
    return list(sets)


def _renamed(node, ids_of: dict, memo: dict):
    """``node`` over pseudo-characters: class i becomes code point i. The AST is a DAG:
    memoised by identity, so shared sub-expressions stay shared."""
    found = memo.get(id(node))
    if found is not None and found[0] is node:
        return found[1]
    kind = node[0]
    if kind == "chars":
        out = ra.chars((c, c) for c in ids_of[node[1]])
    elif kind in ("seq", "alt"):
        out = (kind, tuple(_renamed(child, ids_of, memo) for child in node[1]))
    elif kind == "rep":
        out = ("rep", _renamed(node[1], ids_of, memo), node[2], node[3])
    else:
        out = (kind, _renamed(node[1], ids_of, memo), _renamed(node[2], ids_of, memo))
    memo[id(node)] = (node, out)
    return out
