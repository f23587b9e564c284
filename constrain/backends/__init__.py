"""Structured-output backends behind one interface (``structured_outputs_backend``).

    "tamis" (= "auto")  tamis's own compiler (constrain/compiler.py); always available
    "xgrammar"          xgrammar, when installed (optional yardstick)
    "llguidance"        llguidance, when installed (optional yardstick); "guidance" as vLLM names it

Each is a ``Backend`` (``constrain/backend.py``), built once per tokenizer:
``load_backend(name, tokenizer, vocab_size, info)``; ``backend.compile(params)`` returns a
``Grammar`` whose ``matcher()`` is a ``Matcher``. Compile errors are ``ConstraintError``
naming the backend. ``make_compiler`` puts the named backend behind ``ConstraintCompiler``'s
thread pool, cache and time limit (what the engine's manager uses), tamis's own like the
others.
"""
from __future__ import annotations

import importlib.util

from ..backend import Backend
from ..errors import ConstraintError

BACKENDS = ("tamis", "xgrammar", "llguidance")
ALIASES = {"auto": "tamis", "guidance": "llguidance"}   # vLLM spells llguidance "guidance"
CHOICES = ("auto",) + BACKENDS + ("guidance",)


def resolve_name(name: str | None) -> str:
    """"auto"/None -> "tamis"; ValueError for an unknown name."""
    name = ALIASES.get(name or "auto", name)
    if name not in BACKENDS:
        raise ValueError("structured_outputs_backend (--structured-outputs-backend) must be one "
                         f"of {', '.join(CHOICES)}; got {name!r}")
    return name


def is_installed(name: str) -> bool:
    name = resolve_name(name)
    return name == "tamis" or importlib.util.find_spec(name) is not None


def check_installed(name: str) -> str:
    """The resolved name; ValueError saying how to install it when it is missing."""
    name = resolve_name(name)
    if not is_installed(name):
        raise ValueError(f"structured_outputs_backend={name!r} is not installed: "
                         f"`pip install {name}` (optional yardstick), or use 'tamis'")
    return name


def load_backend(name: str, tokenizer, vocab_size: int, info) -> Backend:
    """The backend ``name`` over this tokenizer (``info``: tamis's TokenizerInfo)."""
    name = check_installed(name)
    if name == "xgrammar":
        from .xgrammar_backend import XGrammarBackend
        return XGrammarBackend(tokenizer, vocab_size, info)
    if name == "llguidance":
        from .llguidance_backend import LLGuidanceBackend
        return LLGuidanceBackend(tokenizer, vocab_size, info)
    from .tamis_backend import TamisBackend
    return TamisBackend(info)


def make_compiler(name: str, tokenizer, vocab_size: int, info, time_limit_s: float):
    """A ``ConstraintCompiler`` (submit/compile/counters/shutdown) over the named backend."""
    from ..compiler import ConstraintCompiler
    return ConstraintCompiler(load_backend(name, tokenizer, vocab_size, info), time_limit_s=time_limit_s)


__all__ = ["BACKENDS", "CHOICES", "ConstraintError", "resolve_name", "is_installed",
           "check_installed", "load_backend", "make_compiler"]
