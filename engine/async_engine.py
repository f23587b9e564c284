"""The server's engine: ``LLMEngine.step()`` in a background thread, outputs streamed
to per-request asyncio queues.

::

    event loop (server)                         engine thread
    -------------------                         -------------
    generate() --("add", id, prompt, params)-->  commands  --drained before each step-->
    abort()    --("abort", ids)------------->              engine.add_request / abort_request
                                                engine.step() -> [RequestOutput]
    stream queues <--call_soon_threadsafe(dispatch, outputs)--

The step loop never runs on the event loop, and the engine is only touched from its
own thread: ``add``/``abort`` are commands queued under a lock and applied between steps,
so no lock is held while a step runs. ``RequestOutput`` values are cumulative, so a
consumer that falls behind reads only the newest output (``generate`` coalesces).

Back-pressure: at most ``max_waiting`` requests may be admitted but not yet producing
output; past that ``generate`` raises ``EngineOverloaded`` before anything is queued
(the server answers 503 with ``Retry-After``).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

logger = logging.getLogger("tamis.engine.async")


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; retry later."""


class EngineDeadError(RuntimeError):
    """The step loop crashed or was shut down; no request can be served."""


class RequestFailed(RuntimeError):
    """The engine refused or failed this request (bad input, grammar compile error).
    ``code`` names a server-side limit the request ran into ("compile_time_limit"), else
    None: the request itself was wrong."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass
class RequestTimes:
    """Wall-clock milestones of one request, for latency metrics (``time.monotonic``)."""
    arrival: float = field(default_factory=time.monotonic)
    first_output: float | None = None
    last_output: float | None = None
    finished: float | None = None
    num_output_tokens: int = 0
    # Gap before each output step after the first (vLLM's inter-token latency: one per step).
    inter_token_latencies: list[float] = field(default_factory=list)


class _Stream:
    """One request's queue on the event loop, plus its timing."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.times = RequestTimes()
        self.started = False  # produced at least one output


class AsyncEngine:
    """Async front of an ``LLMEngine``; see the module docstring for the threading model.

    ``generate(prompt, params, request_id)`` is an async iterator of cumulative
    ``RequestOutput`` values ending with one whose ``finished`` is true. It raises
    ``EngineOverloaded`` (queue full), ``RequestFailed`` (``add_request`` raised
    ``ValueError`` or the output finished with ``finish_reason == "error"``) and
    ``EngineDeadError``. Leaving the iterator early (break, cancellation, client gone)
    aborts the request, which frees its KV blocks at the next step.
    """

    def __init__(self, engine, max_waiting: int | None = 1024, on_finished=None,
                 on_aborted=None):
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.on_finished = on_finished  # (RequestOutput, RequestTimes) on the event loop
        self.on_aborted = on_aborted    # (request_id) on the event loop
        self._streams: dict[str, _Stream] = {}
        self._commands: collections.deque = collections.deque()
        self._wakeup = threading.Condition()
        self._stopping = False
        self._dead: BaseException | None = None
        self._num_not_started = 0
        self.last_stats = None
        self._thread = threading.Thread(target=self._run, name="tamis-engine", daemon=True)
        self._thread.start()

    # ---- public API (event loop side) ----

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def is_alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    async def generate(self, prompt: str | list[int], params,
                       request_id: str, priority: int = 0) -> AsyncIterator[Any]:
        stream = self._admit(request_id)
        self._send(("add", request_id, prompt, params, priority))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                item = _latest(stream.queue, item)
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                _record_progress(stream, item)
                if item.finished:
                    finished = True
                    self._finish(request_id, stream, item)
                    yield item
                    return
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Stops a request and frees its blocks at the next step; a no-op for unknown,
        finished or already aborted ids."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return  # finished, failed, or already aborted: the engine holds nothing
        if not stream.started:
            self._num_not_started -= 1
        self._send(("abort", request_id))
        if self.on_aborted is not None:
            self.on_aborted(request_id)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Aborts every in-flight request, stops the step thread and waits for it."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        self._thread.join(timeout)
        err = EngineDeadError("the server is shutting down")
        for request_id, stream in list(self._streams.items()):
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, err)
            self._streams.pop(request_id, None)

    def check_health(self) -> None:
        if not self.is_alive:
            raise EngineDeadError(f"engine is not running: {self._dead!r}")

    # ---- event-loop bookkeeping ----

    def _admit(self, request_id: str) -> _Stream:
        self.check_health()
        if request_id in self._streams:
            raise RequestFailed(f"request id {request_id!r} is already in flight")
        if self.max_waiting is not None and self._num_not_started >= self.max_waiting:
            raise EngineOverloaded(
                f"{self._num_not_started} requests are already waiting (--max-waiting "
                f"{self.max_waiting}); retry later")
        stream = _Stream(asyncio.get_running_loop())
        self._streams[request_id] = stream
        self._num_not_started += 1
        return stream

    def _finish(self, request_id: str, stream: _Stream, output) -> None:
        self._streams.pop(request_id, None)
        stream.times.finished = time.monotonic()
        if self.on_finished is not None:
            try:
                self.on_finished(output, stream.times)
            except Exception:  # metrics must never break a response
                logger.exception("on_finished callback failed")

    def _dispatch(self, outputs) -> None:
        """Runs on the event loop: routes one step's outputs to their queues."""
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # aborted meanwhile
            if not stream.started:
                stream.started = True
                self._num_not_started -= 1
            stream.queue.put_nowait(output)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        """Runs on the event loop: ends one request with an exception."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        if not stream.started:
            self._num_not_started -= 1
        stream.queue.put_nowait(exc)

    # ---- engine thread ----

    def _send(self, command: tuple) -> None:
        with self._wakeup:
            self._commands.append(command)
            self._wakeup.notify()

    def _run(self) -> None:
        import torch

        # Tensors the engine keeps between steps are made under inference mode (the
        # runner's); the mode is thread-local, so this thread enters it too.
        try:
            with torch.inference_mode():
                self._loop()
        except BaseException as exc:  # noqa: BLE001 - any crash kills every request
            logger.exception("engine step loop crashed")
            self._dead = exc
            self._fail_all(EngineDeadError(f"engine step loop crashed: {exc!r}"))
        finally:
            self._abort_everything()

    def _loop(self) -> None:
        while True:
            commands = self._wait_for_work()
            if commands is None:
                return
            self._apply(commands)
            if self.engine.has_unfinished_requests():
                self._step()
            else:
                self._refresh_stats()  # aborts freed blocks without a step

    def _wait_for_work(self) -> list[tuple] | None:
        with self._wakeup:
            while (not self._stopping and not self._commands
                   and not self.engine.has_unfinished_requests()):
                self._wakeup.wait()
            if self._stopping:
                return None
            commands = list(self._commands)
            self._commands.clear()
            return commands

    def _apply(self, commands: list[tuple]) -> None:
        aborted = [c[1] for c in commands if c[0] == "abort"]
        aborted_set = set(aborted)
        for command in commands:
            if command[0] != "add" or command[1] in aborted_set:
                continue
            _, request_id, prompt, params, priority = command
            try:
                self.engine.add_request(request_id, prompt, params, priority=priority)
            except (ValueError, TypeError) as exc:  # the request's fault: a 400
                self._call_on_loop(request_id, self._fail, request_id, RequestFailed(str(exc)))
            except Exception as exc:  # an engine bug: fail this request (500), keep serving
                logger.exception("add_request(%s) failed", request_id)
                self._call_on_loop(request_id, self._fail, request_id, exc)
        if aborted:
            self.engine.abort_request(aborted)

    def _step(self) -> None:
        outputs = self.engine.step()
        self._refresh_stats()
        if not outputs:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append(output)
        for loop, batch in by_loop.items():
            _call_soon(loop, self._dispatch, batch)

    def _refresh_stats(self) -> None:
        try:
            self.last_stats = self.engine.get_stats()
        except Exception:  # stats are best effort; serving is not
            logger.exception("get_stats failed")

    def _call_on_loop(self, request_id: str, fn, *args) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            _call_soon(stream.loop, fn, *args)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id, stream in list(self._streams.items()):
            _call_soon(stream.loop, self._fail, request_id, exc)

    def _abort_everything(self) -> None:
        ids = list(self._streams)
        ids += [c[1] for c in self._commands if c[0] == "add"]
        if not ids:
            return
        try:
            self.engine.abort_request(ids)
        except Exception:
            logger.exception("abort on shutdown failed")


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass  # the loop is closed: nobody is listening any more


def _latest(queue: asyncio.Queue, item):
    """Skips to the newest queued output (outputs are cumulative); an exception wins."""
    while not isinstance(item, BaseException) and not queue.empty():
        item = queue.get_nowait()
    return item


def _record_progress(stream: _Stream, output) -> None:
    error = getattr(output, "error", None)
    if error or any(c.finish_reason == "error" for c in output.outputs):
        raise RequestFailed(error or "the request failed in the engine",
                            getattr(output, "error_code", None))
    now = time.monotonic()
    times = stream.times
    num_tokens = sum(len(c.token_ids) for c in output.outputs)
    if num_tokens > times.num_output_tokens:
        if times.first_output is None:
            times.first_output = now
        else:
            times.inter_token_latencies.append(now - times.last_output)
        times.last_output = now
        times.num_output_tokens = num_tokens
