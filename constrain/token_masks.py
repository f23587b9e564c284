"""Token masks of an automaton state, and the int32 bitmask layout.

``allowed_tokens(table, dfa, state)`` -> bool per token: the tokens whose bytes, read from
``state``, stay inside the language (``token_walk.allowed``: tokens made only of the state's
looping byte class come from a per-tokenizer cache, the others are walked through the DFA
with numpy, runs of class bytes skipped in one step). ``pack_bits`` turns it into the
int32 bitmask row (bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed), the
layout of xgrammar and vLLM.
"""
from __future__ import annotations

import numpy as np

from .token_table import TokenTable
from .token_walk import allowed

__all__ = ["TokenTable", "allowed_tokens", "pack_bits", "set_bits"]


def allowed_tokens(table: TokenTable, dfa, state: int) -> np.ndarray:
    """bool[vocab_size]: tokens whose bytes, read from ``state``, stay inside the language."""
    return allowed(table, dfa, state)


def pack_bits(allowed: np.ndarray, num_words: int) -> np.ndarray:
    """bool[V] -> int32[num_words] bitmask row (little-endian bit order inside each word)."""
    if len(allowed) == num_words * 32:
        return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)
    padded = np.zeros(num_words * 32, dtype=bool)
    padded[:len(allowed)] = allowed
    return np.packbits(padded, bitorder="little").view("<i4").astype(np.int32, copy=False)


def set_bits(row: np.ndarray, token_ids: np.ndarray) -> None:
    """Sets the bits of ``token_ids`` in the int32 bitmask row ``row`` (in place)."""
    if len(token_ids):
        ids = np.asarray(token_ids, dtype=np.int64)
        np.bitwise_or.at(row.view(np.uint32), ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
