"""token_trie: the vocabulary trie against the token bytes it was built from, and its walk
(``live_tokens``: first-byte filter, ends; the compiled walk, or the numpy one with
TAMIS_NATIVE_CONSTRAIN=0) against a byte-by-byte reference walk of every token."""
import random

import numpy as np
import pytest

from tamis.constrain.automaton import LazyDFA
from tamis.constrain.regex_parser import parse_regex
from tamis.constrain.token_table import TokenTable
from tamis.constrain.token_trie import live_tokens

from test_token_walk import PATTERNS, random_vocab, reference, visited_states

SEEDS = [random.randrange(1 << 30)]


def node_bytes(trie, node: int) -> bytes:
    out = []
    while node:
        out.append(int(trie.byte[node]))
        node = int(trie.parent[node])
    return bytes(out[::-1])


@pytest.mark.parametrize("seed", SEEDS)
def test_trie_holds_every_prefix_once(seed):
    """Every token's node spells its bytes; every node is a distinct prefix of some token;
    the tokens under a node are exactly those starting with its prefix, the ones equal to
    it first (duplicates and empty tokens included in the vocabulary)."""
    rng = random.Random(seed)
    vocab = random_vocab(rng, 400)
    vocab += [vocab[5], vocab[9]]                      # byte strings held by two ids
    table = TokenTable(vocab)
    trie = table.trie
    prefixes = {b[:k] for b in vocab if b for k in range(1, len(b) + 1)}
    spelled = [node_bytes(trie, n) for n in range(1, trie.num_nodes)]
    assert sorted(spelled) == sorted(prefixes), seed
    for t, data in enumerate(vocab):
        if data:
            assert node_bytes(trie, int(trie.node_of[t])) == data, (seed, t)
    for n in range(1, trie.num_nodes):
        prefix = spelled[n - 1]
        under = trie.by_bytes[trie.under_lo[n]:trie.under_hi[n]].tolist()
        assert sorted(under) == [t for t, b in enumerate(vocab) if b and b.startswith(prefix)]
        ending = under[:trie.ending_here[n]]
        assert all(vocab[t] == prefix for t in ending), (seed, prefix)
        assert trie.ending_here[n] == sum(1 for b in vocab if b == prefix)
    for n in range(trie.num_nodes):
        children = range(trie.child_start[n], trie.child_start[n + 1])
        assert all(trie.parent[c] == n for c in children)
        assert trie.has_children[n] == (len(children) > 0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_trie_walk_matches_reference_walk(pattern, seed):
    """live_tokens' tokens and ends equal the reference walk's, restricted to the tokens
    whose first byte is in a random first-byte set when one is given."""
    rng = random.Random(seed)
    vocab = random_vocab(rng, 600)
    table = TokenTable(vocab)
    dfa = LazyDFA(parse_regex(pattern))
    for state in visited_states(dfa, rng, vocab, 8):
        want, want_ends = reference(dfa, state, vocab)
        first_bytes = np.array([rng.random() < 0.5 for _ in range(256)])
        for chosen in (None, first_bytes):
            keep = np.array([bool(b) and (chosen is None or chosen[b[0]]) for b in vocab])
            ends: list = []
            got = live_tokens(table, dfa, state, ends, chosen)
            pairs = {(int(t), int(k)) for tok, cut in ends for t, k in zip(tok, cut)}
            assert (got == (want & keep)).all(), (seed, state, chosen is None)
            assert pairs == {(t, k) for t, k in want_ends if keep[t]}, (seed, state)


def test_empty_vocabulary():
    table = TokenTable([None, b""])
    dfa = LazyDFA(parse_regex("a*"))
    ends: list = []
    assert not live_tokens(table, dfa, dfa.start, ends).any()
    assert ends == []
