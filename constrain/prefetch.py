"""Mask rows computed in the background, between engine steps.

The first visit of an automaton state costs a token walk (milliseconds, in Python/numpy);
every later visit copies a cached row. In the engine a matcher accepts the sampled token at
the end of step N and fills its mask at step N+1, after that step's forward pass. So when a
matcher moves (``accept``, ``rollback``, a new matcher), it asks the one background thread
here to compute the row of the state it is now in: the walk then runs while the model's
forward pass holds no GIL (torch releases it), and the step finds the row cached.

Honesty rules (the step path never gets a wrong or skipped mask):
- a job reads the matcher's state when it *runs* (jump-forward accepts and rolls back several
  tokens in a row: only the final state is worth computing), and only reads shared caches;
- rows are built through ``OnceCache``: when the step needs a row the worker is building,
  it waits for that build (the wait is part of its fill time) instead of building it twice;
- a failed background build is not cached: the step path builds it again and gets the error.

While the worker has work, the GIL switch interval is lowered to ``_SWITCH_INTERVAL_S``
(restored when it is idle): a thread waiting for the GIL waits up to one interval, and the
model's forward pass takes the GIL back after every torch op; at CPython's default 5 ms the
worker's pure-Python row building would stretch the forward pass by up to 5 ms an op.

``set_enabled(False)`` (or ``TAMIS_MASK_PREFETCH=0``) turns it off: the model-free
benchmark measures first visits on the step path, with no idle time to hide them in.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import deque

_enabled = os.environ.get("TAMIS_MASK_PREFETCH", "1").strip().lower() not in ("0", "false", "off", "no")


_SWITCH_INTERVAL_S = 0.0002


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


class OnceCache:
    """``get(store, key, build)``: ``store[key]``, built once even when several threads ask at
    the same time (the others wait for the builder). ``store`` is any dict the caller owns;
    a build that raises stores nothing and wakes the waiters, who then build it themselves."""

    def __init__(self):
        self._lock = threading.Lock()
        self._building: dict = {}

    def get(self, store: dict, key, build):
        found = store.get(key)
        if found is not None:
            return found
        with self._lock:
            found = store.get(key)
            if found is not None:
                return found
            marker = (id(store), key)
            busy = self._building.get(marker)
            mine = busy is None
            if mine:
                # held by the builder until it is done: a waiter acquires it once released
                # (a plain lock: a threading.Event costs a condition and two locks, and a
                # mask fill that first expects hundreds of terminals makes hundreds of them)
                busy = self._building[marker] = threading.Lock()
                busy.acquire()
        if not mine:
            with busy:
                pass
            found = store.get(key)
            return found if found is not None else self.get(store, key, build)
        try:
            found = build()
            store[key] = found
            return found
        finally:
            with self._lock:
                del self._building[marker]
            busy.release()


class _Worker:
    """One daemon thread running jobs first in, first out; a job is submitted once per key
    until it starts (a matcher that moves again before its job ran keeps its one job)."""

    def __init__(self):
        self._jobs: deque = deque()
        self._queued: set = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.jobs_run = 0
        self.busy = False
        self._saved_interval = sys.getswitchinterval()

    def submit(self, key, job) -> None:
        with self._cond:
            if key in self._queued:
                return
            self._queued.add(key)
            self._jobs.append((key, job))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tamis-mask-prefetch",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    self._set_busy(False)
                while not self._jobs:
                    self._cond.wait()
                key, job = self._jobs.popleft()
                self._queued.discard(key)
                self._set_busy(True)
            try:
                job()
            except Exception:       # the step path rebuilds the row and reports the error
                pass
            self.jobs_run += 1

    def _set_busy(self, busy: bool) -> None:
        if busy and not self.busy:
            self._saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._saved_interval, _SWITCH_INTERVAL_S))
        elif not busy and self.busy:
            sys.setswitchinterval(self._saved_interval)
        self.busy = busy

    def idle(self) -> bool:
        with self._cond:
            return not self._jobs and not self.busy

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Tests and benchmarks: waits until no job is queued or running."""
        import time
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.idle():
                return True
            time.sleep(0.001)
        return False


WORKER = _Worker()


def prefetch(matcher) -> None:
    """Asks the worker to build the row of ``matcher``'s state as of when the job runs."""
    if _enabled:
        WORKER.submit(id(matcher), matcher.warm)
