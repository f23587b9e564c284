"""The compiled core (``_native.c``), or None: the numpy/Python code is its reference.

``CORE`` is the extension module when it is built, current (its ``VERSION`` is the one
this code calls) and not turned off by ``TAMIS_NATIVE_CONSTRAIN=0``; else None, and every
caller takes its numpy/Python path. Callers read ``native.CORE`` at each call (a
``LazyDFA`` when it is made: its index of NFA state sets lives on one side), so a test can
switch paths in one process (``monkeypatch.setattr(native, "CORE", None)``).

The extension is built by ``pip install`` (setup.py: optional, an install without a C
compiler falls back); in an editable install it lands beside this file.
"""
from __future__ import annotations

import os

VERSION = 17          # _native.c's NATIVE_VERSION that this code calls

# Trie.walk's ``ends``: none, (token, cut) pairs, or the trie nodes where a lexeme may end.
ENDS_NONE, ENDS_PAIRS, ENDS_NODES = 0, 1, 2


def load_extension():
    """The extension module, whatever the environment says; ImportError saying how to build
    it when it is missing or stale."""
    try:
        from . import _native
    except ImportError as error:
        raise ImportError("constrain/_native.c is not built: run `pip install -e .` "
                          f"(a C compiler is needed): {error}") from error
    if getattr(_native, "VERSION", None) != VERSION:
        raise ImportError(f"constrain/_native is stale (version {getattr(_native, 'VERSION', None)}, "
                          f"expected {VERSION}): run `pip install -e .` again")
    return _native


def _core():
    if os.environ.get("TAMIS_NATIVE_CONSTRAIN", "1").strip() == "0":
        return None
    try:
        return load_extension()
    except ImportError:
        return None


CORE = _core()
