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
    r"[a-z]{1,3}(x[0-9]\n)?",      # class runs past a cut chain ("ax0\n": K = 1 from the start)
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


def check_seed(pattern: str, seed: int, vocab_size: int = 1500) -> None:
    """allowed (with and without ends) equals the reference walk on the random vocabulary
    and DFA states drawn from ``seed``; assertion messages carry the seed."""
    rng = random.Random(seed)
    vocab = random_vocab(rng, vocab_size)
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


# Seeds that once failed (kept as regressions), then one fresh seed per run: its value is in
# the test id and in every assertion message, so a failure can be replayed.
# 523344336: a chain cut after K bytes dropped tokens whose class run was longer than K by
# their exit byte, though they walk on from s_K outside the chain (missed ends, and masks).
FIXED_SEEDS = [523344336]
SEEDS = FIXED_SEEDS + [random.randrange(1 << 30)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_allowed_matches_reference_walk(pattern, seed):
    check_seed(pattern, seed)


def test_run_past_a_cut_chain_is_walked_on():
    """[a-z] moves the start state to s_1 (a chain of K = 1: s_1 is not uniform on [a-z]);
    "aq\n" runs 2 bytes of [a-z], past K, and exits on "\n", live in no chain state but
    live after "aq": it must be walked on from s_1, not pruned by its exit byte."""
    vocab = [None, b"aq\n", b"a", b"aq", b"ab", b"a\n", b"aqq"]
    dfa = LazyDFA(parse_regex(r"[a-z](q\n)?"))
    table = TokenTable(vocab)
    want, want_ends = reference(dfa, dfa.start, vocab)
    assert want.tolist() == [False, True, True, True, False, False, False]
    assert (allowed(table, dfa, dfa.start) == want).all()
    ends: list = []
    assert (allowed(table, dfa, dfa.start, ends) == want).all()
    assert {(int(t), int(k)) for tok, cut in ends for t, k in zip(tok, cut)} == want_ends


def test_tail_run_past_a_cut_chain_is_walked_on():
    """The same through a first-byte group (>= 256 tokens starting with \", cached tails):
    \" leads to a state whose [a-z] chain is cut after K = 1; the tails "ax0\n..." run past
    it and must be walked on (mask), and '"ax0\n"x' ends the string after 6 bytes (ends)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = [None] + [f'"{a}{b}'.encode() for a in letters for b in letters[:12]]
    vocab += [b'"ax0\n', b'"bx1\n"', b'"ax0\n"x', b'"axx0', b'"a0', b'"ab"']
    dfa = LazyDFA(parse_regex(r'"[a-z]{1,3}(x[0-9]\n)?"'))
    table = TokenTable(vocab)
    want, want_ends = reference(dfa, dfa.start, vocab)
    assert want[-6:].tolist() == [True, True, False, True, False, True]
    assert (allowed(table, dfa, dfa.start) == want).all()
    ends: list = []
    assert (allowed(table, dfa, dfa.start, ends) == want).all()
    assert {(int(t), int(k)) for tok, cut in ends for t, k in zip(tok, cut)} == want_ends
    assert (len(vocab) - 4, 6) in want_ends
