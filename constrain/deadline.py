"""A per-thread compile deadline. Compilers call ``check()`` in their loops; past the deadline
it raises ``CompileTimeout`` so a pathological constraint fails fast instead of hogging a
compile thread (Python threads cannot be killed from outside)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from .errors import CompileTimeout

_local = threading.local()


@contextmanager
def deadline(seconds: float | None):
    previous = getattr(_local, "until", None)
    _local.until = None if seconds is None else time.monotonic() + seconds
    _local.seconds = seconds
    try:
        yield
    finally:
        _local.until = previous


def check() -> None:
    until = getattr(_local, "until", None)
    if until is not None and time.monotonic() > until:
        raise CompileTimeout(f"constraint compilation exceeded its time limit of "
                             f"{_local.seconds:.1f}s; simplify the schema or grammar")


def capture() -> tuple:
    """The calling thread's deadline, for ``carried`` to apply in a helper thread."""
    return getattr(_local, "until", None), getattr(_local, "seconds", None)


@contextmanager
def carried(captured: tuple):
    """Runs the block under a deadline ``capture``d in another thread (the same instant)."""
    previous = getattr(_local, "until", None), getattr(_local, "seconds", None)
    _local.until, _local.seconds = captured
    try:
        yield
    finally:
        _local.until, _local.seconds = previous
