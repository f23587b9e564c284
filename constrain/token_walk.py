"""Walking many tokens through a lazy DFA at once, skipping runs of a state's byte class.

A walk item is (token id, byte position, DFA state). ``walk`` advances all items to the
ends of their tokens, dropping those that reach the dead state, and returns the token ids
that survived (their bytes, read from the item's state and position, stay in the language).

*Chains* make runs cheap. A state s has a chain (C, s_0 = s, s_1, ..., s_K) when every byte
of the class C moves s_i to s_{i+1} (a self-loop on C is the chain s, s, s, ... of unbounded
length; a counted repetition such as ``[a-z]{2,10}`` or a ``maxLength`` string is a finite
one). An item in s at position p whose next r bytes are in C (``ClassTokens.runlen``)
jumps to position p + min(r, K) and state s_min(r, K) in one vectorised step; only
the bytes outside C are walked one at a time. From a state's own start (``allowed``),
tokens made only of C bytes and no longer than K are accepted with no walk at all: a
cached per-(tokenizer, C, K) set, so a permissive state (inside a JSON string, free text)
walks only the few hundred tokens that leave C.

Tokens no chain settles (a state without a chain, a first byte whose target has none) are
read through the vocabulary trie (``token_trie``): each prefix shared by many tokens is
read once, one vectorised step per byte position.

Exactness: the jump reads exactly the states the byte-by-byte walk would read (the chain
is checked on every byte of C, and is cut where a row is not uniform on C), so a token is
kept iff its walk is live: never over- or under-accepting.

With the compiled core built (``native.CORE``), ``allowed`` reads every state through its
trie walk (``token_trie.live_tokens``) and ``walk`` walks each item byte by byte in C
(``walk_items``), and none of the above runs: a whole-vocabulary walk in C costs less than
the chains save, for nearly every state measured (docs/constrain_tail_latency.md). The
chain path stays as the numpy fallback and as the reference the compiled walks are tested
against.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from . import native
from .automaton import DEAD
from .token_table import PAD
from .token_trie import live_tokens

# Counted chains (maxLength strings...) are followed this far at most: longer runs are rare
# (token lengths: p99 = 14 bytes on SmolLM2) and each step builds a DFA row.
_MAX_COUNTED_CHAIN = 16
# A chain needs a class of at least this many bytes (smaller ones rarely pay for the
# per-class tables); self-loops need 2.
_MIN_CHAIN_CLASS = 4


class Chain:
    __slots__ = ("members", "tokens", "states", "limit", "accepting", "any_accepting",
                 "loops_after_one", "exit_bytes", "stops")

    def __init__(self, members, tokens, states, accepting, exit_bytes, stops):
        self.members = members            # bool[256]: the class C
        self.tokens = tokens              # ClassTokens of C
        self.states = states              # int64[limit + 1]: state after i bytes of C
        self.limit = len(states) - 1      # K
        self.accepting = accepting        # bool[limit + 1]
        self.any_accepting = bool(accepting[1:].any())
        # s_1 = s_2 = ... up to any token length: a run of r >= 1 bytes always ends in s_1
        self.loops_after_one = bool((states[1:] == states[1]).all()) and len(tokens.lengths) > 0 \
            and self.limit >= tokens.max_len
        self.exit_bytes = exit_bytes      # bool[256]: non-C bytes live in some chain state
        self.stops = stops                # every C byte is dead in s_K: longer runs die


def chain_of(table, dfa, state: int) -> Chain | None:
    """The cached chain of ``state`` (None when no class is worth it)."""
    chains = dfa.chains
    if state in chains:
        return chains[state]
    chain = _build_chain(table, dfa, state)
    chains[state] = chain
    return chain


def _build_chain(table, dfa, state: int) -> Chain | None:
    row = dfa.row(state)
    members = row == state
    if members.sum() >= 2:
        states = np.full(table.max_len + 1, state, dtype=np.int64)
    else:
        live = row[row >= 0]
        if len(live) < _MIN_CHAIN_CLASS:
            return None
        target, count = Counter(live.tolist()).most_common(1)[0]
        if count < _MIN_CHAIN_CLASS:
            return None
        members = row == target
        states = _follow(dfa, state, members, table.max_len, _MAX_COUNTED_CHAIN)
    accepting = dfa.accepting_array()
    exit_bytes = np.zeros(256, dtype=bool)
    for s in set(states.tolist()):
        exit_bytes |= dfa.row(s) >= 0
    exit_bytes &= ~members
    stops = bool((dfa.row(int(states[-1]))[members] < 0).all())
    return Chain(members, table.class_tokens(members), states, accepting[states], exit_bytes, stops)


def _follow(dfa, state: int, members: np.ndarray, max_len: int, cap: int) -> np.ndarray:
    """s_0 = state, s_1, ...: the states a run of ``members`` bytes goes through, cut where
    a row is not uniform (or dead) on the class, or after ``cap`` states (each costs a DFA
    row; longer runs continue from s_cap); a self-loop fills up to ``max_len``."""
    states = [state]
    while len(states) <= cap:
        targets = dfa.row(states[-1])[members]
        nxt = int(targets[0])
        if nxt == DEAD or (targets != nxt).any():
            break
        if nxt == states[-1]:
            states += [nxt] * (max_len + 1 - len(states))
            break
        states.append(nxt)
    return np.asarray(states, dtype=np.int64)


def allowed(table, dfa, state: int, ends: list | None = None) -> np.ndarray:
    """bool[V]: tokens whose bytes, read from ``state``, stay live. With ``ends`` (a list),
    also appends (token ids, k) array pairs: reading the first k bytes (1 <= k < length) of
    the token from ``state`` reaches an accepting state.

    With the compiled core, every token is read through the vocabulary trie in C. Without
    it, tokens the chains cannot settle are read through the trie (``live_tokens``:
    each shared prefix once); those a chain leaves mid-token are walked on from there
    (``walk``)."""
    if native.CORE is not None:
        return live_tokens(table, dfa, state, ends)
    row = dfa.row(state)
    chain = chain_of(table, dfa, state)
    if chain is None or (ends is not None and chain.any_accepting):
        return live_tokens(table, dfa, state, ends)
    result = np.zeros(table.vocab_size, dtype=bool)
    items: list = []
    k = chain.limit
    result |= chain.tokens.upto(k)
    if chain.loops_after_one:
        ids, run = chain.tokens.rest_in.select(dfa.row(int(chain.states[1])) >= 0)
    else:
        # runs longer than k go on from s_k, where bytes outside exit_bytes may be live
        longer_than = None if chain.stops else k
        ids, run = chain.tokens.rest_in.select(chain.exit_bytes, longer_than)
        run = np.minimum(run, k)
        if not chain.stops:
            longer = chain.tokens.longer_than(k)
            items.append((longer, np.full(len(longer), k), chain.states[np.full(len(longer), k)]))
    items.append((ids, run, chain.states[run]))
    first = (row >= 0) & ~chain.members
    by_trie = np.zeros(256, dtype=bool)
    targets = row[first]
    for target in sorted(set(targets.tolist())):
        group = first.copy()
        group[first] = targets == target
        if not _first_byte_group(table, dfa, target, group, ends, result, items):
            by_trie |= group
    if by_trie.any():
        result |= live_tokens(table, dfa, state, ends, by_trie)
    tok = np.concatenate([i[0] for i in items])
    pos = np.concatenate([i[1] for i in items]).astype(np.int64)
    st = np.concatenate([i[2] for i in items]).astype(np.int64)
    result[walk(table, dfa, tok, pos, st, ends)] = True
    return result


# A first-byte group this large is split with the target's chain instead of being walked.
_TAIL_SPLIT_MIN = 256


def _first_byte_group(table, dfa, target, group, ends, result, items) -> bool:
    """Tokens whose first byte (a ``group`` byte) moves the state to ``target``: accepted
    from a cache when the rest is a run of the target's chain class, else walk items.
    False when the target has no chain worth it (the caller reads them through the trie)."""
    first_bytes = np.flatnonzero(group)
    size = int((table.first_start[first_bytes + 1] - table.first_start[first_bytes]).sum())
    if size < _TAIL_SPLIT_MIN:
        return False
    chain = chain_of(table, dfa, target)
    if chain is None or (ends is not None and (chain.any_accepting or chain.accepting[0])):
        return False
    tails = chain.tokens.after(group)
    result |= tails.upto(chain.limit)
    if chain.loops_after_one:
        first, later = int(chain.states[0]), int(chain.states[1])
        ids, run = tails.exit_first.select(dfa.row(first) >= 0)
        items.append((ids, run + 1, np.full(len(ids), first)))
        ids, run = tails.exit_later.select(dfa.row(later) >= 0)
        items.append((ids, run + 1, np.full(len(ids), later)))
        return True
    ids, run = tails.rest(chain.limit, chain.exit_bytes, chain.stops)
    run = np.minimum(run, chain.limit)
    items.append((ids, run + 1, chain.states[run]))
    return True


def walk(table, dfa, tok: np.ndarray, pos: np.ndarray, st: np.ndarray,
         ends: list | None = None) -> np.ndarray:
    """Token ids of the items (tok, pos, st) whose remaining bytes stay live (see module doc).
    ``ends``: as in ``allowed``, for k > the item's starting position. In the compiled core
    when it is built (each item byte by byte: no chains needed), else ``walk_numpy``."""
    core = native.CORE
    if core is None:
        return walk_numpy(table, dfa, tok, pos, st, ends)
    tok = np.ascontiguousarray(tok, dtype=np.int64)
    at = table.offsets[tok] + pos
    accepted, end_tok, end_at = core.walk_items(
        dfa, table.flat, tok, np.ascontiguousarray(at, dtype=np.int64),
        np.ascontiguousarray(st, dtype=np.int64), ends is not None)
    if end_tok:
        end_tok = np.frombuffer(end_tok, dtype=np.int32).astype(np.int64)
        ends.append((end_tok, np.frombuffer(end_at, dtype=np.int32) - table.offsets[end_tok]))
    return np.frombuffer(accepted, dtype=np.int32).astype(np.int64)


def walk_numpy(table, dfa, tok: np.ndarray, pos: np.ndarray, st: np.ndarray,
               ends: list | None = None) -> np.ndarray:
    """``walk`` in numpy: every item one byte position at a time, runs skipped by chains
    (the compiled walk's reference)."""
    accepted = []
    flat = table.flat
    at = table.offsets[tok] + pos                     # absolute index into ``flat``
    while len(tok):
        if len(tok) <= _PYTHON_WALK_MAX:
            accepted.append(_walk_python(table, dfa, tok, at, st, ends))
            break
        if len(tok) >= _SKIP_MIN_ITEMS:
            at, st = _skip_runs(table, dfa, tok, at, st, ends)
        byte = flat.take(at)
        done = byte == PAD
        if done.any():
            accepted.append(tok[done])
            keep = ~done
            tok, at, st, byte = tok[keep], at[keep], st[keep], byte[keep]
            if not len(tok):
                break
        trans = dfa.ensure_rows(st)
        nxt = trans.ravel().take(st * 256 + byte)
        live = nxt >= 0
        if not live.all():
            tok, at, nxt = tok[live], at[live], nxt[live]
        at, st = at + 1, nxt.astype(np.int64)
        if ends is not None and len(tok):
            at_end = dfa.accepting_array()[st] & (flat.take(at) != PAD)
            if at_end.any():
                ends.append((tok[at_end], at[at_end] - table.offsets[tok[at_end]]))
    return np.concatenate(accepted) if accepted else np.empty(0, np.int64)


# So few items are cheaper to finish in plain Python than with ~10 numpy calls per byte.
_PYTHON_WALK_MAX = 24


def _walk_python(table, dfa, tok, at, st, ends) -> np.ndarray:
    """``walk`` for a handful of items, one byte at a time in Python."""
    accepted, end_tok, end_cut = [], [], []
    accepting = dfa.accepting
    starts = (at - table.offsets[tok]).tolist()
    for token, k, state in zip(tok.tolist(), starts, st.tolist()):
        data = table.token_bytes[token]
        size = len(data)
        while k < size:
            state = int(dfa.row(state)[data[k]])
            if state < 0:
                break
            k += 1
            if ends is not None and k < size and accepting[state]:
                end_tok.append(token)
                end_cut.append(k)
        else:
            accepted.append(token)
    if end_tok:
        ends.append((np.asarray(end_tok, dtype=np.int64), np.asarray(end_cut, dtype=np.int64)))
    return np.asarray(accepted, dtype=np.int64)


# Fewer items than this in one state are walked byte by byte (a chain costs DFA rows).
_SKIP_MIN_ITEMS = 24


def _skip_runs(table, dfa, tok, at, st, ends):
    """Moves every item whose state has a chain over its run of class bytes."""
    low, high = int(st.min()), int(st.max())
    if low == high:
        states = [low]
    elif high - low < 4 * len(st) + 4096:   # a dense range: counting beats sorting
        states = (np.flatnonzero(np.bincount(st - low)) + low).tolist()
    else:
        states = np.unique(st).tolist()
    st = st.copy()
    at = at.copy()
    for state in states:
        sel = np.flatnonzero(st == state) if len(states) > 1 else slice(None)
        if len(states) > 1 and len(sel) < _SKIP_MIN_ITEMS:
            continue
        chain = _skip_chain(table, dfa, state)
        if chain is None:
            continue
        run = np.minimum(chain.tokens.runlen.take(at[sel]), chain.limit).astype(np.int64)
        if ends is not None and chain.any_accepting:
            _record_run_ends(chain, tok[sel], at[sel], run, table, ends)
        st[sel] = chain.states[run]
        at[sel] += run
    return at, st


def _skip_chain(table, dfa, state: int) -> Chain | None:
    """The chain worth building for a state met inside tokens: one already built, or a
    self-loop (its row alone); a counted chain costs a DFA row per state it follows, rows
    the walk of these few items would mostly never read."""
    chains = dfa.chains
    if state in chains:
        return chains[state]
    if (dfa.row(state) == state).sum() < 2:
        return None
    return chain_of(table, dfa, state)


def _record_run_ends(chain, tok, at, run, table, ends):
    """Ends inside a run: after i = 1..run bytes where the chain state i accepts."""
    moved = run > 0
    tok, at, run = tok[moved], at[moved], run[moved]
    if not len(tok):
        return
    step = np.arange(int(run.sum())) - np.repeat(np.cumsum(run) - run, run) + 1
    tok, at = np.repeat(tok, run), np.repeat(at, run) + step
    keep = chain.accepting[step] & (table.flat.take(at) != PAD)
    if keep.any():
        ends.append((tok[keep], at[keep] - table.offsets[tok[keep]]))
