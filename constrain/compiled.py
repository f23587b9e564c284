"""Compiled constraints: immutable after construction except for lazily filled caches, shared
by every request with the same (kind, spec, tokenizer)."""
from __future__ import annotations

import numpy as np

from .automaton import LazyDFA
from .backend import Grammar
from .matcher import RegexMatcher
from .prefetch import OnceCache
from .token_masks import allowed_tokens, pack_bits


class CompiledRegex(Grammar):
    """A regular constraint: one lazy DFA; mask rows cached per DFA state (EOS bits included
    for accepting states)."""

    kind = "regex"

    def __init__(self, node, info, description: str = ""):
        self.dfa = LazyDFA(node)
        self.info = info
        self.description = description
        self._rows: dict[int, np.ndarray] = {}
        self._once = OnceCache()        # the step path and the prefetch worker build a row once
        self.empty_row = np.zeros(info.num_words, dtype=np.int32)
        eos = np.zeros(info.vocab_size, dtype=bool)
        eos[list(info.eos_token_ids)] = True
        self._eos_row = pack_bits(eos, info.num_words)

    def matcher(self) -> RegexMatcher:
        return RegexMatcher(self)

    def mask_row(self, state: int) -> np.ndarray:
        row = self._rows.get(state)
        if row is None:
            row = self._once.get(self._rows, state, lambda: self._build_row(state))
        return row

    def has_row(self, state: int) -> bool:
        return state in self._rows

    def store_row(self, state: int, row: np.ndarray) -> None:
        """Caches a row built elsewhere (``row_workers``) for ``state``."""
        self._rows.setdefault(state, row)

    def _build_row(self, state: int) -> np.ndarray:
        return mask_row_of(self.info, self.dfa, state, self._eos_row)


def mask_row_of(info, dfa, state: int, eos_row: np.ndarray) -> np.ndarray:
    """The int32 bitmask row of ``state``: its allowed tokens, and EOS where it accepts."""
    row = pack_bits(allowed_tokens(info.trie, dfa, state), info.num_words)
    if dfa.is_accepting(state):
        row = row | eos_row
    return row
