"""The vocabulary as flat arrays, and context-independent token sets per byte class.

``TokenTable`` (one per tokenizer)::

    flat          every token's bytes followed by PAD = 256 (int16), token after token
    offsets[t]    where token t starts in ``flat``: byte p of t = flat[offsets[t] + p]
    lengths[t]    byte length (0 = never allowed: special / missing ids)
    by_first      token ids with length >= 1 sorted by first byte; bucket of byte x =
                  by_first[first_start[x] : first_start[x + 1]]
    trie          the same bytes as a prefix trie (``token_trie.VocabTrie``)

``ClassTokens`` (one per byte class C, cached on the table): what a DFA state that
self-loops on C -- or moves along a chain of states on any byte of C -- needs to know about
the vocabulary, independent of the automaton (the xgrammar idea of context-independent
tokens)::

    runlen[i]     how many C bytes start at ``flat[i]`` (0 on PAD)     (same layout as flat)
    all_in        tokens made only of C bytes, sorted by length
    rest_in       tokens that start with a C byte and contain a non-C byte (``ExitBuckets``)
    upto(K)       bool[V] of all_in tokens of length <= K (cached per K)
    after(X)      ``TailTokens``: the same split for tokens "one byte of X, then C bytes"
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .token_trie import VocabTrie

PAD = 256
_MAX_CLASSES = 128          # ~0.5 MB each (runlen + cached rows)


class TokenTable:
    def __init__(self, token_bytes: list):
        self.vocab_size = len(token_bytes)
        self.token_bytes = token_bytes
        self.lengths = np.asarray([len(b) if b else 0 for b in token_bytes], dtype=np.int64)
        self.max_len = max(int(self.lengths.max()), 1)
        ends = np.cumsum(self.lengths + 1) - 1                 # index of each token's PAD
        self.offsets = ends - self.lengths
        self.flat = np.full(int(ends[-1]) + 1 if len(ends) else 1, PAD, dtype=np.int16)
        data = np.frombuffer(b"".join(b for b in token_bytes if b), dtype=np.uint8)
        self.flat[np.repeat(self.offsets, self.lengths)
                  + np.arange(len(data)) - np.repeat(np.cumsum(self.lengths) - self.lengths,
                                                     self.lengths)] = data
        has_bytes = np.flatnonzero(self.lengths > 0)
        first = self.flat[self.offsets[has_bytes]]
        order = np.argsort(first, kind="stable")
        self.by_first = has_bytes[order]
        self.first_start = np.searchsorted(first[order], np.arange(257))
        self._classes: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        # built here, with the tokenizer (0.2 s for 49,152 tokens), not inside a mask fill
        self.trie = VocabTrie(self)

    def first_byte_tokens(self, first_bytes) -> np.ndarray:
        """Token ids whose first byte is in ``first_bytes`` (an iterable of ints)."""
        parts = [self.by_first[self.first_start[x]:self.first_start[x + 1]] for x in first_bytes]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def class_tokens(self, members: np.ndarray) -> "ClassTokens":
        """The (cached, LRU) ``ClassTokens`` of the byte class ``members`` (bool[256])."""
        key = np.packbits(members).tobytes()
        with self._lock:
            found = self._classes.get(key)
            if found is not None:
                self._classes.move_to_end(key)
                return found
        built = ClassTokens(self, members)
        with self._lock:
            self._classes[key] = built
            while len(self._classes) > _MAX_CLASSES:
                self._classes.popitem(last=False)
        return built


class ClassTokens:
    def __init__(self, table: TokenTable, members: np.ndarray):
        lut = np.zeros(PAD + 1, dtype=bool)
        lut[:256] = members
        index = np.arange(len(table.flat))
        # next index at or after i that is not a C byte (every token ends with PAD)
        stop = np.minimum.accumulate(np.where(lut[table.flat], len(index), index)[::-1])[::-1]
        self.runlen = (stop - index).astype(np.uint8 if table.max_len < 256 else np.uint16)
        self.lengths = table.lengths
        self.offsets = table.offsets
        self.max_len = table.max_len
        first_out = self.runlen[table.offsets].astype(np.int64)
        all_in = np.flatnonzero((first_out == table.lengths) & (table.lengths > 0))
        order = np.argsort(table.lengths[all_in], kind="stable")
        self.all_in = all_in[order]
        self.all_in_lengths = table.lengths[self.all_in]
        rest_in = np.flatnonzero((first_out > 0) & (first_out < table.lengths))
        self.rest_in = ExitBuckets(table, rest_in, first_out[rest_in], 0)
        self._upto: dict[int, np.ndarray] = {}
        self._table = table
        self._after: dict[bytes, TailTokens] = {}

    def longer_than(self, k: int) -> np.ndarray:
        """all_in tokens of length > k."""
        return self.all_in[np.searchsorted(self.all_in_lengths, k, side="right"):]

    def upto(self, k: int) -> np.ndarray:
        """bool[V]: tokens made only of C bytes, of length 1..k (read-only, cached)."""
        found = self._upto.get(k)
        if found is None:
            found = np.zeros(len(self.lengths), dtype=bool)
            found[self.all_in[:np.searchsorted(self.all_in_lengths, k, side="right")]] = True
            found.flags.writeable = False
            self._upto[k] = found
        return found

    def after(self, first_bytes: np.ndarray) -> "TailTokens":
        """The cached ``TailTokens`` of tokens whose first byte is in ``first_bytes`` (bool[256])."""
        key = np.packbits(first_bytes).tobytes()
        found = self._after.get(key)
        if found is None:
            found = TailTokens(self, self._table.first_byte_tokens(np.flatnonzero(first_bytes).tolist()))
            self._after[key] = found
        return found


class TailTokens:
    """Tokens ``x + tail`` (x in a first-byte set X): split by whether the tail is all C bytes.

    ``upto(K)``: bool[V] of those whose tail is all C and at most K bytes long (cached);
    ``rest(K, ...)``: (ids, run) of the others worth walking, run = the length of the tail's
    leading C run."""

    def __init__(self, cls: ClassTokens, bucket: np.ndarray):
        tail_len = cls.lengths[bucket] - 1
        run = cls.runlen[cls.offsets[bucket] + 1].astype(np.int64)
        all_in = run == tail_len
        ids, lens = bucket[all_in], tail_len[all_in]
        order = np.argsort(lens, kind="stable")
        self.all_in, self.all_in_lengths = ids[order], lens[order]
        self.rest_ids, self.rest_run = bucket[~all_in], run[~all_in]
        self.exit_any = ExitBuckets(cls._table, self.rest_ids, self.rest_run, 1)
        first_run = self.rest_run == 0
        self.exit_first = ExitBuckets(cls._table, self.rest_ids[first_run], self.rest_run[first_run], 1)
        self.exit_later = ExitBuckets(cls._table, self.rest_ids[~first_run], self.rest_run[~first_run], 1)
        self.vocab_size = len(cls.lengths)
        self._upto: dict[int, np.ndarray] = {}

    def upto(self, k: int) -> np.ndarray:
        found = self._upto.get(k)
        if found is None:
            found = np.zeros(self.vocab_size, dtype=bool)
            found[self.all_in[:np.searchsorted(self.all_in_lengths, k, side="right")]] = True
            found.flags.writeable = False
            self._upto[k] = found
        return found

    def rest(self, k: int, exit_bytes: np.ndarray, stops: bool) -> tuple[np.ndarray, np.ndarray]:
        """(ids, run) of the tokens not in ``upto(k)`` that may survive: those leaving the
        run on an ``exit_bytes`` byte, and (unless ``stops``) those whose run -- all-C tail
        or not -- is longer than k (they go on from s_k, outside the chain)."""
        if stops:                      # a run longer than k dies on its byte k + 1
            return self.exit_any.select(exit_bytes)
        ids, run = self.exit_any.select(exit_bytes, longer_than=k)
        cut = np.searchsorted(self.all_in_lengths, k, side="right")
        return (np.concatenate((ids, self.all_in[cut:])),
                np.concatenate((run, self.all_in_lengths[cut:])))


class ExitBuckets:
    """Tokens that leave a class run: ``ids`` with ``run`` class bytes from position
    ``offset``, grouped by the byte that ends the run (the *exit byte*), so a state's live
    bytes pick the tokens worth walking: ``select(live)`` -> (ids, run).

    The exit byte decides only for runs a chain covers: a run longer than the chain's K
    bytes goes on through states outside the chain, where other bytes may be live, so
    ``select(live, longer_than=K)`` also keeps every token whose run exceeds K."""

    def __init__(self, table: TokenTable, ids: np.ndarray, run: np.ndarray, offset: int):
        exit_byte = table.flat[table.offsets[ids] + offset + run].astype(np.int64)
        order = np.argsort(exit_byte, kind="stable")
        self.ids, self.run = ids[order], run[order].astype(np.int64)
        self.exit_byte = exit_byte[order]
        self.start = np.searchsorted(self.exit_byte, np.arange(257))
        self.by_run = np.argsort(self.run, kind="stable")       # positions, shortest run first
        self.sorted_run = self.run[self.by_run]

    def __len__(self) -> int:
        return len(self.ids)

    def select(self, live: np.ndarray, longer_than: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, run) of the tokens whose exit byte is in ``live`` (bool[256]), and, with
        ``longer_than``, of those whose run is longer than it (whatever their exit byte)."""
        if live.all():
            return self.ids, self.run
        start = self.start
        parts = [np.arange(start[x], start[x + 1]) for x in np.flatnonzero(live).tolist()
                 if start[x + 1] > start[x]]
        if longer_than is not None:
            longer = self.by_run[np.searchsorted(self.sorted_run, longer_than, side="right"):]
            parts.append(longer[~live[self.exit_byte[longer]]])       # not already in parts
        if not parts:
            return self.ids[:0], self.run[:0]
        index = np.concatenate(parts)
        return self.ids[index], self.run[index]
