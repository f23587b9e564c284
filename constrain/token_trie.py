"""The vocabulary as a byte trie in flat arrays, walked one level at a time through a DFA.

A token walk (``token_walk.walk``) reads every token's bytes on its own; tokens share
prefixes (SmolLM2: 332,150 token bytes, 100,297 distinct prefixes), and a trie reads each
shared prefix once. Nodes are numbered level by level, each level sorted by (parent, byte),
so the children of a node are one contiguous range::

    node 0           the root (the empty prefix); then the nodes of depth 1, 2, ...
    byte[n]          the byte leading into n, from parent[n]
    child_start[n]   n's children: child_start[n] .. child_start[n + 1]
    node_of[t]       the node of token t's whole byte string (0 for empty tokens)
    by_bytes         token ids sorted by their bytes: the tokens under node n (its prefix
                     and longer) are by_bytes[under_lo[n] : under_hi[n]], those ending at n first

``live_tokens(table, dfa, state, ends)``: the tokens whose bytes all stay live from
``state``, found by walking the nodes whose prefix stays live (every (node, state) pair is
read once; a node is reached in one state only, the DFA being deterministic). The compiled
core walks the trie laid out depth first (``native.CORE.Trie``: a dead prefix's subtree
skipped in one step, and so is a live one whose bytes all follow one chain of states, as a
JSON string's content does under a node of letters) and marks the live nodes' tokens itself. ``walk_trie_numpy``, one
vectorised step per depth, returns the live nodes (``trie_tokens`` turns them into
tokens): the compiled walk's reference and the fallback.
"""
from __future__ import annotations

import numpy as np

from . import native


class VocabTrie:
    """The trie of a ``TokenTable``'s tokens (see the module doc for the arrays)."""

    def __init__(self, table):
        lengths = table.lengths
        with_bytes = np.flatnonzero(lengths > 0).tolist()
        self.by_bytes = np.asarray(sorted(with_bytes, key=table.token_bytes.__getitem__),
                                   dtype=np.int64)
        rank = np.zeros(table.vocab_size, dtype=np.int64)
        rank[self.by_bytes] = np.arange(len(self.by_bytes))
        self.node_of = np.zeros(table.vocab_size, dtype=np.int64)
        # the root (node 0) has no byte of its own: byte[0] is never read
        parents, bytes_ = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        num_nodes = 1
        lows, highs = [np.zeros(1, np.int64)], [np.full(1, len(self.by_bytes), np.int64)]
        node = np.zeros(table.vocab_size, dtype=np.int64)         # each token's node at depth d
        alive = np.asarray(with_bytes, dtype=np.int64)
        depth = 0
        while len(alive):
            depth += 1
            byte = table.flat[table.offsets[alive] + depth - 1].astype(np.int64)
            key = node[alive] * 257 + byte
            unique, inverse = np.unique(key, return_inverse=True)
            node[alive] = num_nodes + inverse
            num_nodes += len(unique)
            parents.append(unique // 257)
            bytes_.append(unique % 257)
            # the tokens under a node are contiguous in by_bytes: their lowest and highest rank
            low = np.full(len(unique), len(self.by_bytes), dtype=np.int64)
            high = np.zeros(len(unique), dtype=np.int64)
            np.minimum.at(low, inverse, rank[alive])
            np.maximum.at(high, inverse, rank[alive] + 1)
            lows.append(low)
            highs.append(high)
            ended = lengths[alive] == depth
            self.node_of[alive[ended]] = node[alive[ended]]
            alive = alive[~ended]
        self.parent = np.concatenate(parents)
        self.byte = np.concatenate(bytes_)
        self.under_lo, self.under_hi = np.concatenate(lows), np.concatenate(highs)
        self.num_nodes = len(self.parent)
        # children of n: nodes whose parent is n; parents are sorted within and across levels
        self.child_start = np.searchsorted(self.parent[1:], np.arange(self.num_nodes + 1)) + 1
        self.has_children = self.child_start[1:] > self.child_start[:-1]
        self.ending_here = np.bincount(self.node_of[self.by_bytes], minlength=self.num_nodes)
        self._native = None
        if native.CORE is not None:      # laid out here (3 ms for SmolLM2), not in a mask fill
            self.native(native.CORE)

    def native(self, core):
        """This trie laid out for the compiled walk (``core.Trie``), built on first use."""
        found = self._native
        if found is None:
            found = self._native = core.Trie(self.child_start, self.byte, self.under_lo,
                                             self.ending_here, self.by_bytes)
        return found

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_native": None}      # a compiled layout does not pickle


def live_tokens(table, dfa, state: int, ends: list | None = None,
                first_bytes: np.ndarray | None = None) -> np.ndarray:
    """bool[V]: tokens whose bytes, read from ``state``, stay live (only those starting with
    a ``first_bytes`` byte, bool[256], when given): ``trie_tokens`` of ``walk_trie_numpy``.
    With ``ends`` (a list), appends (token ids, k) array pairs: the first k bytes of the
    token (1 <= k < its length) read from ``state`` reach an accepting state."""
    core = native.CORE
    if core is None:
        return trie_tokens(table, walk_trie_numpy(table.trie, dfa, state, ends, first_bytes))
    if first_bytes is not None:
        first_bytes = np.ascontiguousarray(first_bytes, dtype=bool)
    tokens = np.zeros(table.vocab_size, dtype=bool)
    want = native.ENDS_NONE if ends is None else native.ENDS_PAIRS
    end_tok, end_cut = table.trie.native(core).walk(dfa, state, tokens, first_bytes, want)
    if end_tok:
        ends.append((np.frombuffer(end_tok, np.int32).astype(np.int64),
                     np.frombuffer(end_cut, np.int32).astype(np.int64)))
    return tokens


def walk_trie_numpy(trie: VocabTrie, dfa, state: int, ends: list | None = None,
                    first_bytes: np.ndarray | None = None) -> np.ndarray:
    """bool[num_nodes]: nodes whose prefix, read from ``state``, stays live (only prefixes
    starting with a ``first_bytes`` byte when given), one vectorised step per depth; ends
    as in ``live_tokens``. The compiled walk's reference and the no-core path."""
    live_nodes = np.zeros(trie.num_nodes, dtype=bool)
    frontier = np.zeros(1, dtype=np.int64)
    states = np.full(1, state, dtype=np.int64)
    child_start, byte = trie.child_start, trie.byte
    depth = 0
    while len(frontier):
        depth += 1
        lo, hi = child_start[frontier], child_start[frontier + 1]
        counts = hi - lo
        total = int(counts.sum())
        if not total:
            break
        children = _ranges(lo, counts, total)
        trans = dfa.ensure_rows(states)
        nxt = trans.ravel().take(np.repeat(states * 256, counts) + byte[children])
        live = nxt >= 0
        if first_bytes is not None and depth == 1:
            live &= first_bytes[byte[children]]
        children, nxt = children[live], nxt[live].astype(np.int64)
        live_nodes[children] = True
        inner = trie.has_children[children]
        if ends is not None:
            _record_ends(trie, children, nxt, inner, dfa, depth, ends)
        frontier, states = children[inner], nxt[inner]
    return live_nodes


def _record_ends(trie, nodes, states, inner, dfa, depth, ends) -> None:
    """Tokens longer than ``depth`` under the accepting ``nodes``: an end after ``depth`` bytes."""
    at_end = inner & dfa.accepting_array()[states]
    if not at_end.any():
        return
    nodes = nodes[at_end]
    lo = trie.under_lo[nodes] + trie.ending_here[nodes]      # tokens ending at n come first
    counts = trie.under_hi[nodes] - lo
    total = int(counts.sum())
    if not total:
        return
    index = _ranges(lo, counts, total)
    ends.append((trie.by_bytes[index], np.full(total, depth, dtype=np.int64)))


def _ranges(lo: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """The ranges lo[i] .. lo[i] + counts[i] - 1 one after the other (``total`` entries)."""
    return np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)


def trie_tokens(table, live_nodes: np.ndarray) -> np.ndarray:
    """bool[V]: the tokens whose whole byte string is a live node."""
    return live_nodes[table.trie.node_of] & (table.lengths > 0)
