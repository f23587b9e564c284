"""``ThreadCore``: the engine core as a thread of the server's own process.

The engine is only touched from this thread: ``send`` queues commands under a lock and
the thread applies them between steps, so no lock is held while a step runs. Its
events go straight to the sink (``AsyncEngine.on_core_event``), on this thread.
``tamis serve --no-engine-process`` and the in-process tests use it; the step loop then
shares the GIL with the event loop.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

from tamis.engine.core.loop import CoreLoop

logger = logging.getLogger("tamis.engine.core")


# How often an idle engine thread checks that its rank processes still run.
_RANK_CHECK_S = 0.5


class ThreadCore:
    """Drives ``engine`` (an ``LLMEngine``, or anything with its step interface) in a
    daemon thread. ``remote`` is False: outputs are the engine's own objects."""

    remote = False

    def __init__(self, engine: Any):
        self.engine = engine
        self._commands: collections.deque = collections.deque()
        self._wakeup = threading.Condition()
        self._stopping = False
        self._loop: CoreLoop | None = None
        self._thread = threading.Thread(target=self._run, name="tamis-engine", daemon=True)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def start(self, on_event: Callable[[tuple], None]) -> None:
        """Starts the step thread; ``on_event`` receives every event (module docstring of
        ``engine/core/loop.py``), on that thread."""
        self._loop = CoreLoop(self.engine, on_event)
        self._thread.start()

    def send(self, command: tuple) -> None:
        with self._wakeup:
            self._commands.append(command)
            self._wakeup.notify()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the thread after its current step and waits up to ``timeout`` seconds;
        the requests still active are aborted (their blocks freed)."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        import torch

        # Tensors the engine keeps between steps are made under inference mode (the
        # runner's); the mode is thread-local, so this thread enters it too.
        try:
            with torch.inference_mode():
                self._serve()
        except BaseException as exc:  # noqa: BLE001 - any crash kills every request
            logger.exception("engine step loop crashed")
            self._loop.emit(("dead", f"engine step loop crashed: {exc!r}"))
        finally:
            self._loop.abort_all()

    def _serve(self) -> None:
        loop = self._loop
        while True:
            commands = self._wait_for_work()
            if commands is None:
                return
            loop.apply(commands)
            if loop.has_work:
                loop.step()

    def _wait_for_work(self) -> list[tuple] | None:
        """The commands that arrived (None: stop). While idle, a multi-process runner's
        ranks are checked every ``_RANK_CHECK_S``: one that ended raises its
        ``RankFailedError`` now, not with the next request."""
        check_ranks = getattr(getattr(self.engine, "runner", None), "check_ranks", None)
        with self._wakeup:
            while not self._stopping and not self._commands and not self._loop.has_work:
                self._wakeup.wait(_RANK_CHECK_S if check_ranks else None)
                if check_ranks is not None:
                    check_ranks()
            if self._stopping:
                return None
            commands = list(self._commands)
            self._commands.clear()
            return commands


__all__ = ["ThreadCore"]
