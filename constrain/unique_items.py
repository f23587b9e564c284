"""``uniqueItems: true`` over strings, enforced beside the automaton while generating.

The automaton of a JSON schema (``json_schema``) cannot count which strings an array already
holds. ``UniqueItemsMatcher`` wraps the schema's matcher and follows the output's JSON
structure byte by byte (``JsonCursor``); at each array the output opens it asks
``json_positions.SchemaPositions`` whether a subschema there wants unique items, and if so it
refuses a token that would close a string item equal to an earlier one (compared as decoded
JSON strings: ``"\\u0041"`` equals ``"A"``). Only tokens holding a double quote can close a
string, so a mask costs the inner matcher's plus a check of the (few) allowed tokens with one.

Liveness: the compiler admits this only for items that are strings of unbounded length
(``json_schema``), so every prefix of an item has endlessly many completions and a distinct
one is always left. The one way the check could empty a mask: a place where two branches
may apply (``SchemaPositions`` keeps both), one asking for unique strings and the other an
array of finitely many strings with more items required than it has distinct values, with
the automaton left on the second branch alone; uniqueness is then enforced on it too.
"""
from __future__ import annotations

import json
import weakref

import numpy as np

from .matcher import ByteMatcher, write_row
from .json_positions import SchemaPositions

QUOTE, BACKSLASH = ord('"'), ord("\\")
WHITESPACE = frozenset(b" \t\r\n")
# TokenTable -> (tokens holding a quote, tokens holding two): one vocabulary scan per tokenizer
_QUOTE_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# A cursor is a tuple (frames, text) where ``frames`` is a tuple of
# (kind, place, index_or_name, phase, seen) from the root down: kind "{" / "[" / "" (the
# root), ``seen`` the decoded string items of an array that wants unique items (else None);
# ``text`` is None outside a string, else (raw bytes so far, escaped, role: "name" / "item" /
# "value").


class JsonCursor:
    """Steps over the bytes of a JSON text the automaton has already checked (so it trusts
    the syntax); ``step`` returns the next cursor, or None where a string item repeats."""

    def __init__(self, positions: SchemaPositions):
        self.positions = positions

    def start(self) -> tuple:
        return (("", self.positions.root(), None, "value", None),), None

    def step(self, cursor: tuple, data: bytes) -> tuple | None:
        frames, text = cursor
        for byte in data:
            if text is not None:
                frames, text = self._in_string(frames, text, byte)
                if frames is None:
                    return None
                continue
            if byte in WHITESPACE:
                continue
            frames, text = self._structural(frames, byte)
        return frames, text

    def _in_string(self, frames, text, byte):
        raw, escaped, role = text
        if escaped:
            return frames, (raw + bytes((byte,)), False, role)
        if byte == BACKSLASH:
            return frames, (raw + b"\\", True, role)
        if byte != QUOTE:
            return frames, (raw + bytes((byte,)), False, role)
        try:
            value = json.loads(b'"' + raw + b'"')
        except ValueError:                       # not JSON text: the automaton refuses it
            value = raw
        kind, place, at, phase, seen = frames[-1]
        if role == "name":
            return frames[:-1] + ((kind, place, value, "colon", seen),), None
        if role == "item" and seen is not None:
            if value in seen:
                return None, None
            return frames[:-1] + ((kind, place, at, phase, seen | {value}),), None
        return frames, None

    def _structural(self, frames, byte):
        kind, place, at, phase, seen = frames[-1]
        if byte in b"]}":
            return frames[:-1], None
        if byte == ord(","):
            if kind == "[":
                return frames[:-1] + ((kind, place, at + 1, "value", seen),), None
            return frames[:-1] + ((kind, place, None, "name", seen),), None
        if byte == ord(":"):
            return frames[:-1] + ((kind, place, at, "value", seen),), None
        if phase == "name":                      # the opening quote of a property name
            return frames, (b"", False, "name")
        if phase != "value":                     # inside a number or a literal
            return frames, None
        parent = frames[:-1] + ((kind, place, at, "after", seen),)
        if byte == QUOTE:
            return parent, (b"", False, "item" if kind == "[" else "value")
        if byte not in b"[{":
            return parent, None
        child = self._child_place(kind, place, at)
        if byte == ord("{"):
            return parent + (("{", child, None, "name", None),), None
        unique = frozenset() if self.positions.wants_unique(child) else None
        return parent + (("[", child, 0, "value", unique),), None

    def _child_place(self, kind, place, at) -> frozenset:
        if kind == "[":
            return self.positions.item(place, at)
        if kind == "{":
            return self.positions.member(place, at)
        return place


class UniqueItemsMatcher(ByteMatcher):
    """A schema's matcher (``inner``) with string items kept unique where the schema asks."""

    def __init__(self, inner: ByteMatcher, cursor: JsonCursor, quote_tokens: np.ndarray,
                 two_quote_tokens: np.ndarray):
        self.inner = inner
        self.info = inner.info
        self._cursor = cursor
        self._quote_tokens = quote_tokens
        self._two_quote_tokens = two_quote_tokens
        self.position = cursor.start()
        self._history: list[tuple] = []

    @property
    def finished(self) -> bool:
        return self.inner.finished

    def fill_bitmask(self, bitmask, row: int) -> None:
        self.inner.fill_bitmask(bitmask, row)
        if self.inner.finished:
            return
        if isinstance(bitmask, np.ndarray):
            self._drop_repeats(bitmask[row].view(np.uint32))
            return
        words = bitmask[row].cpu().numpy().copy()      # a torch tensor: through a copy
        self._drop_repeats(words.view(np.uint32))
        write_row(bitmask, row, words)

    def _drop_repeats(self, words: np.ndarray) -> None:
        """Clears the bits of allowed tokens that would close a repeated string item."""
        for token in self._tokens_to_check():
            word, bit = token >> 5, np.uint32(1 << (token & 31))
            if words[word] & bit and self._cursor.step(self.position, self.info.token_bytes[token]) is None:
                words[word] &= ~bit

    def _tokens_to_check(self) -> np.ndarray:
        """Tokens that may close a string item: any with a quote inside an item of an array
        that wants unique items, else only those with two (one opens, one closes)."""
        frames, text = self.position
        if text is not None and text[2] == "item" and frames[-1][4] is not None:
            return self._quote_tokens
        return self._two_quote_tokens

    def accept(self, token_id: int) -> bool:
        plain = token_id not in self.info.eos_token_ids and 0 <= token_id < self.info.vocab_size
        data = self.info.token_bytes[token_id] if plain else None   # EOS: no bytes to follow
        return self._advance(data, lambda: self.inner.accept(token_id))

    def accept_bytes(self, data: bytes) -> bool:
        return self._advance(data, lambda: self.inner.accept_bytes(data))

    def _advance(self, data: bytes | None, inner_accepts) -> bool:
        position = self.position if data is None else self._cursor.step(self.position, data)
        if position is None or not inner_accepts():
            return False
        self._history.append(self.position)
        self.position = position
        return True

    def rollback(self, n: int) -> None:
        self.inner.rollback(n)
        for _ in range(n):
            self.position = self._history.pop()

    def is_complete(self) -> bool:
        return self.inner.is_complete()

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def forced_bytes(self, limit: int = 256) -> bytes:
        return self.inner.forced_bytes(limit)

    def warm(self) -> None:
        self.inner.warm()


class CompiledUniqueItems:
    """A compiled JSON schema (``inner``: ``CompiledRegex`` or ``CompiledGrammar``) whose
    matchers keep string items unique where ``positions`` says the schema asks."""

    def __init__(self, inner, positions: SchemaPositions):
        self.inner = inner
        self.kind = inner.kind
        self.info = inner.info
        self.description = inner.description
        self._cursor = JsonCursor(positions)
        self._quote_tokens, self._two_quote_tokens = _tokens_with_quotes(self.info.trie)

    def matcher(self) -> UniqueItemsMatcher:
        return UniqueItemsMatcher(self.inner.matcher(), self._cursor, self._quote_tokens,
                                  self._two_quote_tokens)


def _tokens_with_quotes(table) -> tuple[np.ndarray, np.ndarray]:
    """(ids of the tokens holding a double quote, of those holding two or more), computed
    once per tokenizer's ``TokenTable`` rather than once per compiled schema."""
    found = _QUOTE_TOKENS.get(table)
    if found is None:
        quotes = np.array([data.count(b'"') if data else 0 for data in table.token_bytes])
        found = _QUOTE_TOKENS[table] = (np.flatnonzero(quotes >= 1), np.flatnonzero(quotes >= 2))
    return found
