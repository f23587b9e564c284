"""Timing an object's method from outside, for the benchmarks' host-time breakdowns."""
from __future__ import annotations

import time
from typing import Callable


def time_calls(owner, attr: str, record: Callable[[float], None]) -> None:
    """Replaces ``owner.attr`` with a wrapper that calls ``record(seconds)`` with the wall
    time of every call, one that raises included."""
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            record(time.perf_counter() - start)
    setattr(owner, attr, timed)
