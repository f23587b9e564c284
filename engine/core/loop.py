"""The body of the engine core's loop, shared by ``ThreadCore`` and ``ProcessCore``.

Commands (applied between steps, in arrival order; an add aborted in the same batch is
never added)::

    ("add", request_id, prompt, params, priority)
    ("abort", request_id)

Events, handed to ``emit`` (at most one ``outputs`` event per engine step, never one per
token)::

    ("outputs", [RequestOutput], EngineStats | None)  a step's outputs, the stats after it
    ("stats", EngineStats | None)                     no outputs: aborts freed blocks, or
                                                      a step made none (rate-limited)
    ("failed", request_id, message, request_fault)    add_request refused the request
                                                      (ValueError/TypeError: its fault, a
                                                      400) or broke (an engine bug, a 500)

The loop never waits: its owner blocks on its command source while ``has_work`` is false.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

logger = logging.getLogger("tamis.engine.core")

# A step without outputs (grammars compiling, prefill chunks) reports stats at most this often.
_IDLE_STATS_SECONDS = 0.1


class CoreLoop:
    """Applies commands to ``engine`` (an ``LLMEngine``) and runs its steps.

    ``packer``: optional, with ``pack(outputs) -> outputs`` (shapes a step's outputs for
    the trip to the server) and ``forget(request_ids)`` (aborted requests).
    """

    def __init__(self, engine: Any, emit: Callable[[tuple], None], packer: Any = None):
        self.engine = engine
        self.emit = emit
        self.packer = packer
        self.active: set[str] = set()      # added and neither finished nor aborted
        self._last_stats_time = 0.0

    @property
    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def apply(self, commands: list[tuple]) -> None:
        aborted = [c[1] for c in commands if c[0] == "abort"]
        aborted_set = set(aborted)
        for command in commands:
            if command[0] == "add" and command[1] not in aborted_set:
                self._add(*command[1:])
        if aborted:
            self.abort(aborted)

    def abort(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)
        self.active.difference_update(request_ids)
        if self.packer is not None:
            self.packer.forget(request_ids)
        if not self.has_work:
            self.report_stats()   # the freed blocks show without a step

    def abort_all(self) -> None:
        """Aborts every active request (shutdown); never raises."""
        if not self.active:
            return
        try:
            self.engine.abort_request(list(self.active))
        except Exception:
            logger.exception("abort on shutdown failed")
        self.active.clear()

    def step(self) -> None:
        outputs = self.engine.step()
        if not outputs:
            if time.monotonic() - self._last_stats_time >= _IDLE_STATS_SECONDS:
                self.report_stats()
            return
        for output in outputs:
            if output.finished:
                self.active.discard(output.request_id)
        if self.packer is not None:
            outputs = self.packer.pack(outputs)
        self.emit(("outputs", outputs, self._stats()))

    def report_stats(self) -> None:
        self.emit(("stats", self._stats()))

    def _add(self, request_id: str, prompt: Any, params: Any, priority: int) -> None:
        try:
            self.engine.add_request(request_id, prompt, params, priority=priority)
        except (ValueError, TypeError) as exc:   # the request's fault: a 400
            self.emit(("failed", request_id, str(exc), True))
            return
        except Exception as exc:   # an engine bug: this request fails (500), serving goes on
            logger.exception("add_request(%s) failed", request_id)
            self.emit(("failed", request_id, f"{type(exc).__name__}: {exc}", False))
            return
        self.active.add(request_id)

    def _stats(self):
        self._last_stats_time = time.monotonic()
        try:
            return self.engine.get_stats()
        except Exception:   # stats are best effort; serving is not
            logger.exception("get_stats failed")
            return None


__all__ = ["CoreLoop"]
