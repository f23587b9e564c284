"""Small shared fragments of an NFA replaced by their minimal DFA.

A sub-expression used in many places (a JSON string's character or escape, a number) is
built once and pasted wherever it occurs (``automaton._paste``); ``maxLength`` 255 pastes a
string's character 255 times. A fragment pasted often enough is minimized once. Thompson's construction leaves such a fragment with a state per
branch and per repetition (the escape ``\\uD83D\\uDE00``'s four spellings of hex digits: 33
states); its minimal DFA shares every common tail (16). The DFA is built from the fragment's
own NFA, minimized (Moore's partition refinement over byte rows), trimmed to the states that
can still reach the end, and written back as an NFA fragment: one state per class, byte
ranges as edges, an epsilon edge from each accepting class to one fresh end state. Exact:
the same strings lead from its start to its end.
"""
from __future__ import annotations

import numpy as np

from .automaton import DEAD, NFA, LazyDFA

MAX_FRAGMENT_STATES = 256


def minimal_fragment(nfa: NFA, start: int, end: int) -> tuple[NFA, int] | None:
    """(sealed fragment, its end) with state 0 its start, never re-entered and the end without
    edges (as ``automaton._paste`` wants them); None past ``MAX_FRAGMENT_STATES`` DFA states
    or for an empty language."""
    dfa = LazyDFA.from_nfa(nfa, end)
    first = dfa.start_at(start)
    states = _reachable(dfa, first)
    if states is None:
        return None
    number = np.full(dfa.num_states + 1, DEAD, dtype=np.int64)    # DFA state -> row index
    number[states] = np.arange(len(states))
    raw = np.stack([dfa.row(s) for s in states]).astype(np.int64)
    rows = np.where(raw >= 0, number[np.maximum(raw, 0)], DEAD)
    accepting = np.array([dfa.is_accepting(s) for s in states])
    live = _can_finish(rows, accepting)
    if not live[0]:
        return None
    rows = np.where((rows >= 0) & live[np.maximum(rows, 0)], rows, DEAD)
    classes = _classes(rows, accepting)
    return _written(rows, accepting, live, classes)


def _reachable(dfa: LazyDFA, first: int) -> list | None:
    states, seen = [first], {first}
    for state in states:
        for t in np.unique(dfa.row(state)).tolist():
            if t >= 0 and t not in seen:
                if len(states) >= MAX_FRAGMENT_STATES:
                    return None
                seen.add(t)
                states.append(t)
    return states


def _can_finish(rows: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    live = accepting.copy()
    while True:
        more = live | ((rows >= 0) & live[np.maximum(rows, 0)]).any(axis=1)
        if (more == live).all():
            return live
        live = more


def _classes(rows: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Moore's refinement: states stay together while they agree on accepting and on the
    class of their target for every byte."""
    classes = accepting.astype(np.int64)
    count = len(set(classes.tolist()))
    while True:
        targets = np.where(rows >= 0, classes[np.maximum(rows, 0)], -1)
        ids: dict = {}
        refined = np.array([ids.setdefault((c, row.tobytes()), len(ids))
                            for c, row in zip(classes.tolist(), targets)], dtype=np.int64)
        if len(ids) == count:
            return classes
        classes, count = refined, len(ids)


def _written(rows, accepting, live, classes) -> tuple[NFA, int]:
    """The classes of live states as NFA states: 0 a copy of the start's class (so that no
    edge re-enters it), then one per class, then the end."""
    kept = sorted({int(classes[s]) for s in range(len(rows)) if live[s]})
    number = {c: i + 1 for i, c in enumerate(kept)}
    representative = {}
    for s in range(len(rows)):
        if live[s]:
            representative.setdefault(int(classes[s]), s)
    out = NFA()
    out.reserve(len(kept) + 2)
    end = len(kept) + 1
    for state, s in [(0, 0)] + [(number[c], representative[c]) for c in kept]:
        targets = np.where(rows[s] >= 0, classes[np.maximum(rows[s], 0)], -1)
        for lo, hi, c in _runs(targets):
            out.add_edge(state, lo, hi, number[c])
        if accepting[s]:
            out.add_eps(state, end)
    out.seal()
    return out, end


def _runs(targets: np.ndarray):
    """(lo, hi, target) for each run of bytes with the same target (dead ones skipped)."""
    change = np.flatnonzero(targets[1:] != targets[:-1]) + 1
    bounds = [0] + change.tolist() + [len(targets)]
    for lo, stop in zip(bounds, bounds[1:]):
        if targets[lo] >= 0:
            yield lo, stop - 1, int(targets[lo])
