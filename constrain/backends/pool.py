"""``ConstraintCompiler``'s pool, cache and counters around a non-tamis backend.

Only the compile step differs: the backend's native code runs without tamis's cooperative
deadline (it cannot be interrupted); the manager's wall-clock limit in ``is_ready`` still
fails a request whose compile never returns."""
from __future__ import annotations

import time

from ..compiler import DEFAULT_TIME_LIMIT_S, ConstraintCompiler


class BackendCompiler(ConstraintCompiler):
    def __init__(self, backend, time_limit_s: float = DEFAULT_TIME_LIMIT_S, **kwargs):
        super().__init__(time_limit_s=time_limit_s, **kwargs)
        self.backend = backend

    def _compile(self, params, info):
        start = time.perf_counter()
        try:
            params.validate()
            return self.backend.compile(params)
        finally:
            with self._lock:
                self.num_compiles += 1
                self.compile_seconds += time.perf_counter() - start
