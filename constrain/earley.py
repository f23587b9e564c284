"""An incremental Earley recognizer over terminal ids, for grammars whose terminals are regexes.

Symbols: nonterminals are ``0 .. num_nonterminals-1``; terminal ``t`` is encoded as
``num_nonterminals + t``. ``EarleySet`` objects are immutable once built and each one knows the
chain of sets before it, so a parse state is just its last set: branching (several lexings
in flight) and rollback cost nothing. ``scan(terminal)`` results are memoised on the set, so
every request and every mask computation at the same position shares the work.

Nullable nonterminals are handled as Aycock & Horspool do: predicting a nullable symbol also
advances over it.
"""
from __future__ import annotations

import weakref
from array import array

from . import native


class EarleyGrammar:
    def __init__(self, num_nonterminals: int, productions: list[tuple[int, tuple]], start: int,
                 num_terminals: int):
        self.num_nonterminals = num_nonterminals
        self.num_terminals = num_terminals
        self.productions = productions
        self.start = start
        self.by_lhs: list[list[int]] = [[] for _ in range(num_nonterminals)]
        for index, (lhs, _) in enumerate(productions):
            self.by_lhs[lhs].append(index)
        self.nullable = self._nullable()
        self._native = None           # native.CORE.EarleyTables, made on first use

    def native_tables(self, core):
        """The productions as the compiled core's EarleyTables (made once)."""
        if self._native is None:
            rhs_start, rhs = array("i", [0]), array("i")
            for _, right in self.productions:
                rhs.extend(right)
                rhs_start.append(len(rhs))
            by_lhs_start, by_lhs = array("i", [0]), array("i")
            for indices in self.by_lhs:
                by_lhs.extend(indices)
                by_lhs_start.append(len(by_lhs))
            nullable = bytes(1 if n in self.nullable else 0 for n in range(self.num_nonterminals))
            self._native = core.EarleyTables(
                self.num_nonterminals, self.num_nonterminals + self.num_terminals, self.start,
                array("i", (lhs for lhs, _ in self.productions)), rhs_start, rhs, by_lhs_start,
                by_lhs, nullable)
        return self._native

    def _nullable(self) -> set[int]:
        return derivable(self.productions, given_from=None)

    def is_terminal(self, symbol: int) -> bool:
        return symbol >= self.num_nonterminals

    def initial_set(self) -> "EarleySet":
        kernel = {(p, 0, 0) for p in self.by_lhs[self.start]}
        return EarleySet(self, None, kernel)


def derivable(productions, given_from: int | None) -> set[int]:
    """The left-hand sides of ``productions`` that derive a string of given symbols (those
    >= ``given_from``; none if None): the empty string when none is given (the nullable
    nonterminals), some string of terminals when the terminals are (the productive ones).

    A worklist: each production counts its right-hand side's symbols not known yet, and a
    symbol once known decrements the productions waiting on it. Linear in the grammar's size,
    where passes over every production until none changes cost a pass per level of nesting."""
    waiting: dict[int, list[int]] = {}      # symbol -> productions, once per occurrence
    missing: list[int] = []
    known: list[int] = []
    for index, (lhs, rhs) in enumerate(productions):
        pending = [s for s in rhs if given_from is None or s < given_from]
        missing.append(len(pending))
        for symbol in pending:
            waiting.setdefault(symbol, []).append(index)
        if not pending:
            known.append(lhs)
    found: set[int] = set()
    while known:
        symbol = known.pop()
        if symbol in found:
            continue
        found.add(symbol)
        for index in waiting.get(symbol, ()):
            missing[index] -= 1
            if missing[index] == 0:
                known.append(productions[index][0])
    return found


class EarleySet:
    """One Earley set. ``ancestor(position)`` finds an earlier set of the same parse by jump
    pointers (O(log n) hops, Myers' skew-binary scheme), so a set holds two references to
    its past instead of the whole chart: a copied chart tuple per set was quadratic in the
    parse's length, and every full garbage collection rescanned it. Items waiting on a
    symbol are kept as tuples of int tuples, which the collector stops tracking."""
    __slots__ = ("grammar", "position", "previous", "_jump", "waiting", "expected", "accepting",
                 "_scans", "mask_cache", "__weakref__")

    def __init__(self, grammar: EarleyGrammar, previous: "EarleySet | None", kernel: set):
        self.grammar = grammar
        self.previous = previous
        self.position = 0 if previous is None else previous.position + 1
        self._jump = None if previous is None else _jump_for_child_of(previous)
        core = native.CORE
        if core is not None:         # the compiled closure: the same waiting, the same flag
            self.waiting, self.accepting = grammar.native_tables(core).closure(
                list(kernel), self.position, self)
        else:
            waiting: dict[int, list] = {}        # symbol after the dot -> items
            items = self._closure(kernel, waiting)
            self.waiting = {symbol: tuple(found) for symbol, found in waiting.items()}
            self.accepting = any(
                grammar.productions[p][0] == grammar.start and o == 0
                and d == len(grammar.productions[p][1]) for p, d, o in items)
        nt = grammar.num_nonterminals
        self.expected = frozenset(s - nt for s in self.waiting if s >= nt)
        # terminal -> the set after it (a weak reference), or None when not expected. Weak:
        # a set reaches its past (``previous``), and a strong link forward made every parse
        # a cycle, kept until a full garbage collection (tens of ms inside a mask fill), and
        # a cached grammar's root held every parse ever made with it. A successor lives as
        # long as a matcher (or a later set) holds it.
        self._scans: dict[int, weakref.ref | None] = {}
        self.mask_cache: dict = {}

    def ancestor(self, position: int) -> "EarleySet":
        """The set of this parse at ``position`` (<= this set's)."""
        node = self
        while node.position > position:
            jump = node._jump
            node = jump if jump is not None and jump.position >= position else node.previous
        return node

    def _closure(self, kernel: set, waiting: dict) -> set:
        g = self.grammar
        items = set(kernel)
        todo = list(kernel)
        position = self.position
        earlier: dict[int, dict] = {}        # origin -> that set's waiting items
        while todo:
            item = todo.pop()
            p, dot, origin = item
            rhs = g.productions[p][1]
            if dot < len(rhs):
                symbol = rhs[dot]
                waiting.setdefault(symbol, []).append(item)
                if symbol < g.num_nonterminals:
                    for q in g.by_lhs[symbol]:
                        new = (q, 0, position)
                        if new not in items:
                            items.add(new)
                            todo.append(new)
                    if symbol in g.nullable:
                        new = (p, dot + 1, origin)
                        if new not in items:
                            items.add(new)
                            todo.append(new)
                continue
            lhs = g.productions[p][0]
            if origin == position:
                source = waiting
            else:
                source = earlier.get(origin)
                if source is None:
                    source = earlier[origin] = self.ancestor(origin).waiting
            for wp, wd, wo in list(source.get(lhs, ())):
                new = (wp, wd + 1, wo)
                if new not in items:
                    items.add(new)
                    todo.append(new)
        return items

    def scan(self, terminal: int) -> "EarleySet | None":
        """The set after reading ``terminal``, or None if it is not expected here."""
        known = self._scans.get(terminal, _NOT_SCANNED)
        if known is None:
            return None
        if known is not _NOT_SCANNED:
            alive = known()
            if alive is not None:
                return alive
        if terminal not in self.expected:
            self._scans[terminal] = None
            return None
        symbol = terminal + self.grammar.num_nonterminals
        kernel = {(p, d + 1, o) for p, d, o in self.waiting[symbol]}
        result = EarleySet(self.grammar, self, kernel)
        # setdefault: a set scanned by two threads at once (the prefetch worker and the step)
        # keeps one successor object, so their mask caches stay shared
        mine = weakref.ref(result)
        stored = self._scans.setdefault(terminal, mine)
        if stored is not mine and stored is not known:
            other = stored()
            if other is not None:
                return other
        self._scans[terminal] = mine
        return result


_NOT_SCANNED = object()


def _jump_for_child_of(parent: EarleySet) -> EarleySet:
    """The jump pointer of a new set after ``parent``: past ``parent``'s jump when the two
    jumps span equal distances (skew-binary), else ``parent`` itself."""
    jump = parent._jump
    if jump is not None and jump._jump is not None \
            and parent.position - jump.position == jump.position - jump._jump.position:
        return jump._jump
    return parent
