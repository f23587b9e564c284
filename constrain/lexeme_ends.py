"""Where a grammar terminal may end inside tokens, and the tokens that go on past that end.

A grammar's mask has a *crossing* part (``grammar_matcher``): tokens whose first bytes end
terminal t (read from state s) and whose rest is a live prefix of a next terminal u. The
walk of t's row from s finds the ends; ``continued`` then reads each end's rest from u's
start. Two forms, the same tokens::

    ItemEnds   (token, cut) items: the first ``cut`` bytes of the token end t
               (the numpy path: the rest walked item by item, ``token_walk.walk``)
    NodeEnds   vocabulary trie nodes, each standing for every token longer than the
               node, cut at its depth (the compiled core: the rest read as a trie walk of
               the node's subtree, each shared byte once, a string's run in one step)

``state_row_with_ends(table, dfa, state)`` -> (bool[V] live tokens, ends) picks the form.
"""
from __future__ import annotations

import numpy as np

from . import native
from .token_walk import allowed, walk


class ItemEnds:
    """Ends as (token ids, cuts), int64 arrays of one length."""

    def __init__(self, tokens: np.ndarray, cuts: np.ndarray):
        self.tokens, self.cuts = tokens, cuts

    def __len__(self) -> int:
        return len(self.tokens)

    def next_bytes(self, table) -> np.ndarray:
        """bool[256]: the bytes that follow some end."""
        found = np.zeros(256, dtype=bool)
        found[table.flat[table.offsets[self.tokens] + self.cuts]] = True
        return found

    def continued(self, table, dfa, state: int, alive: np.ndarray) -> None:
        """Sets alive[t] for each token whose bytes past one of its ends stay live from
        ``state`` of ``dfa``."""
        if len(self.tokens):
            start = np.full(len(self.tokens), state, dtype=np.int64)
            alive[walk(table, dfa, self.tokens, self.cuts, start)] = True


class NodeEnds:
    """Ends as depth-first node positions of the compiled trie (``native.CORE.Trie``), int32."""

    def __init__(self, trie, nodes: np.ndarray):
        self.trie, self.nodes = trie, nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def next_bytes(self, table) -> np.ndarray:
        return np.frombuffer(self.trie.next_bytes(self.nodes), dtype=bool)

    def continued(self, table, dfa, state: int, alive: np.ndarray) -> None:
        if len(self.nodes):
            self.trie.walk_below(dfa, state, self.nodes, alive)

    def as_items(self) -> ItemEnds:
        """The same ends as (token, cut) items."""
        tokens, cuts = self.trie.end_pairs(self.nodes)
        return ItemEnds(np.frombuffer(tokens or b"", np.int32).astype(np.int64),
                        np.frombuffer(cuts or b"", np.int32).astype(np.int64))


def state_row_with_ends(table, dfa, state: int) -> tuple[np.ndarray, ItemEnds | NodeEnds]:
    """(bool[V]: the tokens live from ``state``, where the terminal may end inside them)."""
    core = native.CORE
    if core is None:
        ends: list = []
        alive = allowed(table, dfa, state, ends)
        if not ends:
            return alive, ItemEnds(np.empty(0, np.int64), np.empty(0, np.int64))
        return alive, ItemEnds(np.concatenate([e[0] for e in ends]),
                               np.concatenate([e[1] for e in ends]))
    trie = table.trie.native(core)
    alive = np.zeros(table.vocab_size, dtype=bool)
    nodes, _ = trie.walk(dfa, state, alive, None, native.ENDS_NODES)
    return alive, NodeEnds(trie, np.frombuffer(nodes or b"", dtype=np.int32))
