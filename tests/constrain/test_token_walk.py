"""token_walk.allowed (class-run skipping, cached context-independent token sets) against a
byte-by-byte reference walk of every token, on random vocabularies and random DFA states."""
import random

import numpy as np
import pytest

from tamis.constrain.automaton import DEAD, LazyDFA
from tamis.constrain.regex_parser import parse_regex
from tamis.constrain.token_table import TokenTable
from tamis.constrain.token_walk import allowed

PATTERNS = [
    r"(([a-z]{2,10}) ){3}",
    r'"([^"\\]|\\.){0,12}"',
    r'\{"name":"([^"\\]|\\.)*","n":-?[0-9]+\}',
    r"[a-zA-Z_][a-zA-Z0-9_]*( [a-z]+)*",
    r"(\r?\n)?[ \t]{0,20}x",
    r".{0,9}z",
    r"[0-9]+(\.[0-9]+)?( [0-9]+)*",
    r"(ab|a[b-d]{1,3}|é+)*c",
    r"[^x]*x[^y]{2,5}",
]
ALPHABET = list(" abcdexyzABZ019_\"\\{}:,.\n\t-") + ["é", "€", "😀"]


def random_vocab(rng: random.Random, size: int) -> list:
    vocab = [None, b""]
    for _ in range(size):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.choice([1, 1, 2, 3, 4, 6, 9, 14])))
        data = text.encode()
        if rng.random() < 0.05:                        # partial UTF-8 sequences exist in BPE
            data = data[:rng.randrange(1, len(data) + 1)]
        vocab.append(data)
    vocab += [b"a" * n for n in range(1, 30)] + [b" " * n for n in range(1, 25)]
    return vocab


def reference(dfa, state, vocab):
    ok = np.array([bool(b) and dfa.walk(state, b) != DEAD for b in vocab])
    ends = {(t, k) for t, b in enumerate(vocab) if b for k in range(1, len(b))
            if dfa.is_accepting(dfa.walk(state, b[:k]))}
    return ok, ends


def visited_states(dfa, rng, vocab, count):
    states, state = {dfa.start}, dfa.start
    for _ in range(count * 4):
        data = rng.choice([b for b in vocab if b])
        nxt = dfa.walk(state, data)
        if nxt != DEAD:
            state = nxt
            states.add(state)
        elif rng.random() < 0.2:
            state = dfa.start
    return sorted(states)[:count]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_allowed_matches_reference_walk(pattern):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    vocab = random_vocab(rng, 1500)
    table = TokenTable(vocab)
    dfa = LazyDFA(parse_regex(pattern))
    for state in visited_states(dfa, rng, vocab, 12):
        want, want_ends = reference(dfa, state, vocab)
        got = allowed(table, dfa, state)
        ends: list = []
        got_with_ends = allowed(table, dfa, state, ends)
        pairs = {(int(t), int(k)) for tok, cut in ends for t, k in zip(tok, cut)}
        assert (got == want).all(), (seed, state, [vocab[i] for i in np.flatnonzero(got != want)])
        assert (got_with_ends == want).all(), (seed, state)
        assert pairs == want_ends, (seed, state, sorted(pairs ^ want_ends)[:5])
