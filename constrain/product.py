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
"""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from . import deadline
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
    alphabet = _char_classes(a, b)
    if alphabet is None:
        return _ProductBuilder(nfa, a, b, mode, None).build(start)
    classes, ids_of = alphabet
    memo: dict = {}
    return _ProductBuilder(nfa, _renamed(a, ids_of, memo), _renamed(b, ids_of, memo),
                           mode, classes).build(start)


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
        bound = _length_bound(b) if classes is not None and mode == "and" else None
        if bound is None:
            self.right, self.settle = LazyDFA(b, allow_empty_language=True), None
        else:
            self.right = _LengthCounter(self.left, len(classes), *bound)
            self.settle = self.right.settle
        self.ids: dict[tuple[int, int], int] = {}
        self.queue: list[tuple[int, int]] = []
        self.left_runs: dict[int, list] = {}   # left state -> its runs of counted symbols
        self.hops: dict = {}           # (target, remaining byte ranges) -> intermediate state
        self.paths: dict = {}          # pseudo-characters -> their UTF-8 byte-range paths

    def build(self, start: int) -> int:
        nfa, left, right = self.nfa, self.left, self.right
        end = nfa.new_state()
        if left.start == DEAD:
            return end                  # empty language: nothing reaches the end
        nfa.add_eps(start, self._state((left.start, right.start)))
        alphabet = 256 if self.classes is None else len(self.classes)
        while self.queue:
            pair = self.queue.pop()
            here = self.ids[pair]
            in_right = pair[1] != DEAD and right.is_accepting(pair[1])
            if left.is_accepting(pair[0]) and in_right != self.diff:
                nfa.add_eps(here, end)
            for lo, hi, target in self._pair_runs(pair, alphabet):
                if self.classes is None:
                    nfa.add_edge(here, lo, hi, self._state(target))
                else:
                    self._char_edges(here, range(lo, hi + 1), self._state(target))
        return end

    def _pair_runs(self, pair: tuple[int, int], alphabet: int) -> list:
        """(lo, hi, target pair) of each run of symbols leaving ``pair``. Against a length
        counter every counted symbol moves the count alike: the runs are those of the left
        state (kept per left state), each moving to the next count."""
        left, right = self.left, self.right
        if self.settle is None:
            row_r = (right.row(pair[1]) if pair[1] != DEAD else _DEAD_ROW)[:alphabet]
            return list(_runs(left.row(pair[0])[:alphabet], row_r, self.diff))
        nxt = right.next(pair[1])
        if nxt == DEAD:
            return []
        runs = self.left_runs.get(pair[0])
        if runs is None:
            runs = self.left_runs[pair[0]] = [
                (lo, hi, target[0]) for lo, hi, target in
                _runs(left.row(pair[0])[:alphabet], right.counted, False)]
        return [(lo, hi, self.settle((target, nxt))) for lo, hi, target in runs]

    def _state(self, pair: tuple[int, int]) -> int:
        found = self.ids.get(pair)
        if found is None:
            if len(self.ids) >= MAX_PRODUCT_STATES:
                raise ConstraintError("constraint too large: the intersection of two "
                                      "sub-expressions (e.g. pattern and maxLength) is too big")
            if len(self.ids) & 1023 == 0:
                deadline.check()
            found = self.ids[pair] = self.nfa.new_state()
            self.queue.append(pair)
        return found

    def _char_edges(self, here: int, symbols: range, target: int) -> None:
        """Edges from ``here`` to ``target`` reading one character of the ``symbols`` classes."""
        key = (symbols.start, symbols.stop)
        paths = self.paths.get(key)
        if paths is None:
            ranges = ra.normalize_ranges([r for s in symbols for r in self.classes[s]])
            paths = self.paths[key] = [p for lo, hi in ranges for p in utf8_sequences(lo, hi)]
        for path in paths:
            lo, hi = path[0]
            self.nfa.add_edge(here, lo, hi, self._hop(target, path[1:]))

    def _hop(self, target: int, rest: tuple) -> int:
        """The state from which ``rest`` (byte ranges) leads to ``target``."""
        if not rest:
            return target
        found = self.hops.get((target, rest))
        if found is None:
            found = self.hops[(target, rest)] = self.nfa.new_state()
            lo, hi = rest[0]
            self.nfa.add_edge(found, lo, hi, self._hop(target, rest[1:]))
        return found


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
