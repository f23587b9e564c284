"""The bytes a regex AST's strings can start with, without building its automaton.

``first_bytes(node)`` -> bool[256], a superset (exact for chars/seq/alt/rep; products and
object-member lists are over-approximated), so "no byte in common" safely means "this
expression cannot start here": the grammar matcher uses it to skip terminals whose lazy DFA
would otherwise be built just to find that no token crosses into them.
"""
from __future__ import annotations

import numpy as np

from . import regex_ast as ra
from .utf8 import utf8_sequences

_ALL = np.ones(256, dtype=bool)
_ALL.flags.writeable = False


def first_bytes(node, memo: dict | None = None) -> np.ndarray:
    memo = {} if memo is None else memo
    key = id(node)
    found = memo.get(key)
    if found is None:
        found = _first(node, memo)
        memo[key] = found
    return found


def _first(node, memo: dict) -> np.ndarray:
    kind = node[0]
    out = np.zeros(256, dtype=bool)
    if kind == "chars":
        for lo, hi in node[1]:
            for seq in utf8_sequences(lo, hi):
                out[seq[0][0]:seq[0][1] + 1] = True
    elif kind == "seq":
        empty_memo = memo.setdefault(("matches_empty",), {})
        for child in node[1]:
            out |= first_bytes(child, memo)
            if not _may_be_empty(child, empty_memo):
                break
    elif kind == "alt":
        for child in node[1]:
            out |= first_bytes(child, memo)
    elif kind == "rep":
        if node[3] != 0:
            out |= first_bytes(node[1], memo)
    elif kind in ("and", "diff"):
        out |= first_bytes(node[1], memo)
    elif kind == "multiple":
        out[0x30:0x3A] = True
    else:                                   # props, rule references: anything
        return _ALL
    return out


def _may_be_empty(node, memo: dict) -> bool:
    """Over-approximates "matches the empty string" (a wrong True only widens the set)."""
    try:
        if node[0] in ("and", "diff"):
            return ra.matches_empty(node[1], memo)
        if node[0] == "props":
            return True
        return ra.matches_empty(node, memo)
    except ValueError:                      # rule references
        return True
