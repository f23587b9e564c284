"""tamis's own matchers (the ``Matcher`` protocol of ``backend.py``) over a compiled regex;
``ByteMatcher``, their common base, also serves ``grammar_matcher.GrammarMatcher``.

Beyond the protocol, tamis's matchers walk bytes::

    accept_bytes(data) -> bool  advances over raw bytes (tests, the bench); False = rejected,
                                state unchanged
    forced_bytes(limit)         the bytes the constraint forces next (whence ``jump_forward``)
    warm()                      builds the current state's mask ahead (``prefetch.py``)
"""
from __future__ import annotations

from abc import abstractmethod

import numpy as np

from .automaton import DEAD
from .backend import Matcher
from .prefetch import prefetch


def write_row(bitmask, row: int, words: np.ndarray) -> None:
    if isinstance(bitmask, np.ndarray):
        bitmask[row, :len(words)] = words
        return
    import torch
    bitmask[row, :len(words)].copy_(torch.from_numpy(words))


def decodable_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is complete UTF-8, decoded."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class ByteMatcher(Matcher):
    """A matcher that walks bytes: ``jump_forward`` is the decodable prefix of the forced
    bytes."""

    def jump_forward(self) -> str | None:
        return decodable_prefix(self.forced_bytes()) or None

    @abstractmethod
    def forced_bytes(self, limit: int = 256) -> bytes:
        """The bytes every continuation starts with (at most ``limit``), until the text could
        be complete."""

    @abstractmethod
    def accept_bytes(self, data: bytes) -> bool:
        """Advances over raw bytes; False = rejected, state unchanged."""

    @abstractmethod
    def warm(self) -> None:
        """Builds (and caches) the mask of the current state without writing it anywhere:
        the prefetch worker's job (``prefetch.py``); reads shared caches only."""


class RegexMatcher(ByteMatcher):
    """Matcher over a ``CompiledRegex`` (regex, choice, regular JSON schemas)."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.dfa = compiled.dfa
        self.info = compiled.info
        self.state = self.dfa.start
        self.history: list[int] = []
        self.finished = False          # EOS accepted
        prefetch(self)

    def warm(self) -> None:
        state = self.state
        if not self.finished and state != DEAD:
            self.compiled.mask_row(state)

    def fill_bitmask(self, bitmask, row: int) -> None:
        if self.finished:
            words = self.compiled.empty_row
        else:
            words = self.compiled.mask_row(self.state)
        write_row(bitmask, row, words)

    def accept(self, token_id: int) -> bool:
        if self.finished:
            return False
        if token_id in self.info.eos_token_ids:
            if not self.dfa.is_accepting(self.state):
                return False
            self.history.append(self.state)
            self.finished = True
            return True
        data = self.info.token_bytes[token_id] if 0 <= token_id < self.info.vocab_size else None
        if not data:
            return False
        return self.accept_bytes(data)

    def accept_bytes(self, data: bytes) -> bool:
        nxt = self.dfa.walk(self.state, data)
        if nxt == DEAD:
            return False
        self.history.append(self.state)
        self.state = nxt
        if not self.compiled.has_row(nxt):
            prefetch(self)
        return True

    def rollback(self, n: int) -> None:
        if n > len(self.history):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self.history)} accepted")
        for _ in range(n):
            self.state = self.history.pop()
            self.finished = False
        if not self.compiled.has_row(self.state):
            prefetch(self)

    def is_complete(self) -> bool:
        return self.dfa.is_accepting(self.state)

    def is_terminated(self) -> bool:
        if self.finished:
            return True
        return self.dfa.is_accepting(self.state) and not self.dfa.can_continue(self.state)

    def forced_bytes(self, limit: int = 256) -> bytes:
        out, state = bytearray(), self.state
        while len(out) < limit and not self.dfa.is_accepting(state):
            b = self.dfa.forced_byte(state)
            if b is None:
                break
            out.append(b)
            state = int(self.dfa.row(state)[b])
        return bytes(out)
