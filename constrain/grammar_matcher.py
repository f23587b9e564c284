"""Compiled grammars and their matchers: an Earley parser over regex terminals, with
nondeterministic lexing and token masks built from precomputed per-terminal masks.

A parse *hypothesis* is ``(earley_set, lexeme, nonempty)``: the Earley set after the last
completed lexeme, and the live (terminal, dfa_state) pairs of the lexeme in progress. A
matcher holds the set of hypotheses consistent with the bytes so far (usually one or two).

Masks (``CompiledGrammar.hypothesis_mask``), all cached, so a step is a union of rows:
- *inside* the lexeme: ``rows[t][s]``, the tokens that keep terminal t alive from state s;
- *starting* the next lexeme (the current one may end here): the union of ``rows[t'][start]``
  over the terminals X the parser expects after t (cached per X);
- *crossing* one lexeme boundary inside a token: ``cross(t, s, X)``, tokens whose bytes end t
  somewhere and continue as a live prefix of some t' in X: the (token, cut) pairs where t
  can end are recorded by the walk of ``rows[t][s]`` (``lexeme_ends``), then walked
  on from each t' start (cached).
Tokens that cross two or more boundaries are left out of the mask (``accept`` still handles
them): the mask is exact for the others and never allows a token ``accept`` would refuse.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .automaton import DEAD, LazyDFA
from .backend import Grammar
from .first_bytes import first_bytes
from .grammar import GrammarSpec
from .matcher import ByteMatcher, write_row
from .prefetch import OnceCache, prefetch
from .token_masks import pack_bits
from .lexeme_ends import state_row_with_ends


# Earley sets a compiled grammar keeps alive after their parses ended (each with its past
# and its cached masks): requests on one schema mostly repeat the same first sets.
RECENT_SETS = 1024


class CompiledGrammar(Grammar):
    kind = "grammar"

    def __init__(self, spec: GrammarSpec, info, description: str = ""):
        self.spec = spec
        self.info = info
        self.description = description
        self.dfas = _LazyList(spec.terminals, lambda node: LazyDFA(node, allow_empty_language=True))
        self.ignore = frozenset(spec.ignore)
        self._rows: dict = {}
        self._fresh_rows: dict = {}
        self._cross_rows: dict = {}
        self._ends: dict = {}              # (t, s) -> lexeme_ends.ItemEnds | NodeEnds
        self._starts: dict = {}            # terminal -> bool[256] of its possible first bytes
        self._first_memo: dict = {}
        self._once = OnceCache()        # the step path and the prefetch worker build a row once
        # The Earley sets scanned last, kept alive with their pasts (and mask caches): a set
        # holds its successors weakly, so without this a parse would be recomputed by every
        # request after the ones that made it had finished.
        self._recent_sets: deque = deque(maxlen=RECENT_SETS)
        self.empty_row = np.zeros(info.num_words, dtype=np.int32)
        eos = np.zeros(info.vocab_size, dtype=bool)
        eos[list(info.eos_token_ids)] = True
        self.eos_row = pack_bits(eos, info.num_words)
        self.initial = self.fresh_hypothesis(spec.earley.initial_set())

    def matcher(self) -> "GrammarMatcher":
        return GrammarMatcher(self)

    # ---- hypotheses ------------------------------------------------------------------------
    def expected(self, earley_set) -> frozenset:
        return earley_set.expected | self.ignore

    def fresh_hypothesis(self, earley_set) -> tuple:
        lexeme = tuple((t, self.dfas[t].start) for t in sorted(self.expected(earley_set))
                       if self.dfas[t].start != DEAD)
        return (earley_set, lexeme, False)

    def after_lexeme(self, earley_set, terminal: int):
        """The Earley set once ``terminal`` is complete (ignored terminals do not advance it)."""
        if terminal in self.ignore and terminal not in earley_set.expected:
            return earley_set
        after = earley_set.scan(terminal)
        if after is not None:
            self._recent_sets.append(after)
        return after

    def advance(self, hypotheses, byte: int) -> list:
        out = {}
        for hyp in hypotheses:
            earley_set, lexeme, nonempty = hyp
            moved = tuple((t, int(self.dfas[t].row(s)[byte])) for t, s in lexeme)
            moved = tuple(pair for pair in moved if pair[1] != DEAD)
            if moved:
                out[(earley_set, moved, True)] = None
            if not nonempty:
                continue
            for t, s in lexeme:
                if not self.dfas[t].is_accepting(s):
                    continue
                after = self.after_lexeme(earley_set, t)
                if after is None:
                    continue
                _, fresh, _ = self.fresh_hypothesis(after)
                moved = tuple((u, int(self.dfas[u].row(q)[byte])) for u, q in fresh)
                moved = tuple(pair for pair in moved if pair[1] != DEAD)
                if moved:
                    out[(after, moved, True)] = None
        return list(out)

    def is_complete(self, hyp) -> bool:
        earley_set, lexeme, nonempty = hyp
        if not nonempty:
            return earley_set.accepting
        for t, s in lexeme:
            if self.dfas[t].is_accepting(s):
                after = self.after_lexeme(earley_set, t)
                if after is not None and after.accepting:
                    return True
        return False

    # ---- masks -----------------------------------------------------------------------------
    def has_mask(self, hyp) -> bool:
        return (hyp[1], hyp[2]) in hyp[0].mask_cache

    def hypothesis_mask(self, hyp) -> np.ndarray:
        earley_set, lexeme, nonempty = hyp
        key = (lexeme, nonempty)
        cached = earley_set.mask_cache.get(key)
        if cached is not None:
            return cached
        return self._once.get(earley_set.mask_cache, key, lambda: self._build_mask(hyp))

    def _build_mask(self, hyp) -> np.ndarray:
        earley_set, lexeme, nonempty = hyp
        row = self.empty_row.copy()
        for t, s in lexeme:
            row |= self.state_row(t, s)
            if not self._can_end_inside(t, s):
                continue
            after = self.after_lexeme(earley_set, t)
            if after is None:
                continue
            expected = self.expected(after)
            if nonempty and self.dfas[t].is_accepting(s):
                # the lexeme may end right here: everything the next lexeme allows,
                # including its own boundary crossings
                row |= self.hypothesis_mask(self.fresh_hypothesis(after)) & ~self.eos_row
            row |= self.cross_row(t, s, expected)
        if self.is_complete(hyp):
            row |= self.eos_row
        return row

    def state_row(self, t: int, s: int) -> np.ndarray:
        key = (t, s)
        row = self._rows.get(key)
        if row is None:
            row = self._once.get(self._rows, key, lambda: self._build_state_row(t, s))
        return row

    def _build_state_row(self, t: int, s: int) -> np.ndarray:
        alive, ends = state_row_with_ends(self.info.trie, self.dfas[t], s)
        self._ends[(t, s)] = ends       # before the row is stored: readers of a row see it
        return pack_bits(alive, self.info.num_words)

    def fresh_row(self, expected: frozenset) -> np.ndarray:
        row = self._fresh_rows.get(expected)
        if row is None:
            row = self.empty_row.copy()
            for t in expected:
                row |= self.state_row(t, self.dfas[t].start)
            self._fresh_rows[expected] = row
        return row

    def cross_row(self, t: int, s: int, expected: frozenset) -> np.ndarray:
        key = (t, s, expected)
        row = self._cross_rows.get(key)
        if row is None:
            row = self._once.get(self._cross_rows, key, lambda: self._build_cross_row(t, s, expected))
        return row

    def _build_cross_row(self, t: int, s: int, expected: frozenset) -> np.ndarray:
        self.state_row(t, s)
        ends = self._ends[(t, s)]
        table = self.info.trie
        alive = np.zeros(table.vocab_size, dtype=bool)
        if len(ends):
            next_bytes = ends.next_bytes(table)
            for u in expected:
                if not (self._first_bytes(u) & next_bytes).any():
                    continue            # no end is followed by a byte u can start with
                dfa = self.dfas[u]
                if dfa.start != DEAD:
                    ends.continued(table, dfa, dfa.start, alive)
        return pack_bits(alive, self.info.num_words)

    def _first_bytes(self, u: int) -> np.ndarray:
        found = self._starts.get(u)
        if found is None:
            found = first_bytes(self.spec.terminals[u], self._first_memo)
            self._starts[u] = found
        return found

    def _can_end_inside(self, t: int, s: int) -> bool:
        self.state_row(t, s)
        return self.dfas[t].is_accepting(s) or len(self._ends[(t, s)]) > 0


class _LazyList:
    """``items[i]`` built by ``factory(sources[i])`` on first access: a grammar's terminals are
    compiled only once the lexer can reach them."""

    def __init__(self, sources, factory):
        self._sources, self._factory = sources, factory
        self._items = [None] * len(sources)
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._items)

    def __getitem__(self, index):
        item = self._items[index]
        if item is None:
            with self._lock:
                item = self._items[index]
                if item is None:
                    item = self._items[index] = self._factory(self._sources[index])
        return item


class GrammarMatcher(ByteMatcher):
    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self.info = compiled.info
        self.hypotheses = [compiled.initial]
        self.history: list = []
        self.finished = False
        prefetch(self)

    def warm(self) -> None:
        if not self.finished:
            for hyp in self.hypotheses:
                self.compiled.hypothesis_mask(hyp)

    def _moved(self) -> None:
        if not all(self.compiled.has_mask(h) for h in self.hypotheses):
            prefetch(self)

    def fill_bitmask(self, bitmask, row: int) -> None:
        if self.finished:
            write_row(bitmask, row, self.compiled.empty_row)
            return
        if len(self.hypotheses) == 1:
            words = self.compiled.hypothesis_mask(self.hypotheses[0])
        else:
            words = self.compiled.empty_row.copy()
            for hyp in self.hypotheses:
                words |= self.compiled.hypothesis_mask(hyp)
        write_row(bitmask, row, words)

    def accept(self, token_id: int) -> bool:
        if self.finished:
            return False
        if token_id in self.info.eos_token_ids:
            if not self.is_complete():
                return False
            self.history.append(self.hypotheses)
            self.finished = True
            return True
        data = self.info.token_bytes[token_id] if 0 <= token_id < self.info.vocab_size else None
        return bool(data) and self.accept_bytes(data)

    def accept_bytes(self, data: bytes) -> bool:
        hypotheses = self.hypotheses
        for byte in data:
            hypotheses = self.compiled.advance(hypotheses, byte)
            if not hypotheses:
                return False
        self.history.append(self.hypotheses)
        self.hypotheses = hypotheses
        self._moved()
        return True

    def rollback(self, n: int) -> None:
        if n > len(self.history):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self.history)} accepted")
        for _ in range(n):
            self.hypotheses = self.history.pop()
            self.finished = False
        self._moved()

    def is_complete(self) -> bool:
        return any(self.compiled.is_complete(h) for h in self.hypotheses)

    def is_terminated(self) -> bool:
        if self.finished:
            return True
        if not self.is_complete():
            return False
        return not self._can_continue()

    def _can_continue(self) -> bool:
        for earley_set, lexeme, nonempty in self.hypotheses:
            for t, s in lexeme:
                if self.compiled.dfas[t].can_continue(s):
                    return True
                if self.compiled.dfas[t].is_accepting(s):
                    after = self.compiled.after_lexeme(earley_set, t)
                    if after is not None and self.compiled.expected(after):
                        return True
        return False

    def forced_bytes(self, limit: int = 256) -> bytes:
        out = bytearray()
        hypotheses = self.hypotheses
        while len(out) < limit and not any(self.compiled.is_complete(h) for h in hypotheses):
            candidates = set()
            for _, lexeme, _ in hypotheses:
                for t, s in lexeme:
                    candidates.update(np.flatnonzero(self.compiled.dfas[t].row(s) >= 0).tolist())
            live = [b for b in sorted(candidates) if self.compiled.advance(hypotheses, b)]
            if len(live) != 1 or not self._only_byte(hypotheses, live[0]):
                break
            out.append(live[0])
            hypotheses = self.compiled.advance(hypotheses, live[0])
        return bytes(out)

    def _only_byte(self, hypotheses, byte: int) -> bool:
        """True if no other byte could follow (including ones that start a new lexeme)."""
        for hyp in hypotheses:
            earley_set, lexeme, nonempty = hyp
            if nonempty and any(self.compiled.dfas[t].is_accepting(s) for t, s in lexeme):
                return False
        return True
