"""Token masks of an automaton state, computed by walking the vocabulary trie level by level.

``VocabTrie`` stores the vocabulary's byte strings as a trie in flat arrays::

    node 0 = root; node_byte[n] = byte on the edge into n
    children of n = child_nodes[child_start[n] : child_start[n] + child_count[n]]
    token_node[token_id] = node spelling that token (or the sentinel N = never allowed)

``allowed_tokens(dfa, state)`` advances every frontier (node, dfa_state) pair by one byte
with numpy gathers, pruning dead pairs, so a state that allows few bytes touches few nodes.
The result is a bool per token; ``pack_bits`` turns it into the int32 bitmask row
(bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed), the layout of xgrammar and vLLM.
"""
from __future__ import annotations

import numpy as np


class VocabTrie:
    def __init__(self, token_bytes: list):
        self.vocab_size = len(token_bytes)
        node_of: dict[bytes, int] = {b"": 0}
        parents, bytes_in = [-1], [-1]
        for data in sorted({b for b in token_bytes if b}):
            for i in range(1, len(data) + 1):
                prefix = data[:i]
                if prefix not in node_of:
                    node_of[prefix] = len(parents)
                    parents.append(node_of[data[:i - 1]])
                    bytes_in.append(data[i - 1])
        self.num_nodes = len(parents)
        parent = np.asarray(parents, dtype=np.int64)
        self.node_byte = np.asarray(bytes_in, dtype=np.int64)
        order = np.argsort(parent[1:], kind="stable") + 1   # nodes grouped by parent
        self.child_nodes = order
        counts = np.bincount(parent[1:], minlength=self.num_nodes)
        self.child_count = counts
        self.child_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
        sentinel = self.num_nodes
        self.token_node = np.asarray(
            [node_of[b] if b else sentinel for b in token_bytes], dtype=np.int64)
        self.root_children = self.child_nodes[:counts[0]]

    def children(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All children of ``nodes`` and, for each child, the index of its parent in ``nodes``."""
        counts = self.child_count[nodes]
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        owner = np.repeat(np.arange(len(nodes)), counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        return self.child_nodes[self.child_start[nodes][owner] + offsets], owner


def allowed_tokens(trie: VocabTrie, dfa, state: int) -> np.ndarray:
    """bool[vocab_size]: tokens whose bytes, read from ``state``, stay inside the language."""
    alive = np.zeros(trie.num_nodes + 1, dtype=bool)
    nodes = trie.root_children
    states = np.full(len(nodes), state, dtype=np.int64)
    while len(nodes):
        trans = dfa.ensure_rows(np.unique(states))
        nxt = trans[states, trie.node_byte[nodes]]
        keep = nxt >= 0
        nodes, nxt = nodes[keep], nxt[keep]
        alive[nodes] = True
        nodes, owner = trie.children(nodes)
        states = nxt[owner].astype(np.int64)
    return alive[trie.token_node]


def pack_bits(allowed: np.ndarray, num_words: int) -> np.ndarray:
    """bool[V] -> int32[num_words] bitmask row (little-endian bit order inside each word)."""
    padded = np.zeros(num_words * 32, dtype=bool)
    padded[:len(allowed)] = allowed
    return np.packbits(padded, bitorder="little").view("<i4").astype(np.int32, copy=False)
