"""The seam between the engine and a structured-output backend, stated as types.

    Backend.compile(params) -> Grammar       once per (spec, tokenizer), in the compile pool
    Grammar.matcher() -> Matcher             once per request
    Matcher.fill_bitmask / accept / rollback / is_complete / is_terminated / jump_forward

tamis's own compiler (``backends.tamis_backend``), xgrammar and llguidance
(``backends.xgrammar_backend``, ``backends.llguidance_backend``) each implement ``Backend``;
``ConstraintCompiler`` (pool, cache, time limit) and the engine's ``StructuredOutputManager``
compile and match through it. The manager, not the backend, decides when the engine's own stop
ids may end the output (the EOS policy, in ``StructuredOutputManager.fill_bitmask``): a matcher
reports ``is_complete`` and allows the tokenizer's EOS ids where it would accept them.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Protocol, runtime_checkable

from .params import StructuredOutputsParams
from .tokenizer_info import TokenizerInfo


@runtime_checkable
class Matcher(Protocol):
    """One request's progress through a compiled constraint. Not thread-safe: the engine
    drives it from one thread.

    ``finished`` is True once EOS was accepted (then no token is allowed). A class that
    subclasses this protocol must define every method (they are abstract)."""

    finished: bool

    @abstractmethod
    def fill_bitmask(self, bitmask, row: int) -> None:
        """Writes row ``row`` of ``bitmask`` (int32 [batch, ceil(V/32)], a numpy array or a CPU
        torch tensor): bit set = token allowed next; the EOS ids only where ``is_complete``;
        no bit at all once ``finished``."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advances over ``token_id``; False (state unchanged) if the constraint forbids it."""

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undoes the last ``n`` accepted tokens; ValueError if fewer were accepted."""

    @abstractmethod
    def is_complete(self) -> bool:
        """The text so far is a complete match: EOS would be accepted now."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """EOS was accepted, or the text is complete and nothing but EOS can follow."""

    @abstractmethod
    def jump_forward(self) -> str | None:
        """The text the constraint forces next (not consumed), or None if none is forced."""


@runtime_checkable
class Grammar(Protocol):
    """A compiled constraint: immutable once built (lazily filled caches aside), shared by
    every request with the same spec, safe to use from several threads."""

    @abstractmethod
    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the constraint."""


@runtime_checkable
class Backend(Protocol):
    """A compiler of constraints for one tokenizer (``info``).

    ``name`` is the ``structured_outputs_backend`` value that selects it."""

    name: str
    info: TokenizerInfo

    @abstractmethod
    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """Compiles ``params`` now, in this thread. Raises ``ConstraintError`` (a ValueError)
        naming what cannot be compiled, and ``ValueError`` for a malformed spec. tamis's own
        compiler stops at the calling thread's ``deadline`` (``CompileTimeout``); the others
        run to the end."""


__all__ = ["Backend", "Grammar", "Matcher"]
