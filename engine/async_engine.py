"""The server's engine: an engine core (``engine/core/``) fronted by per-request asyncio
queues on the event loop.

::

    event loop (server)                          engine core (a thread, or a process)
    -------------------                          ------------------------------------
    generate() --core.send(("add", ...))------>  applied between steps
    abort()    --core.send(("abort", id))----->  frees the request's blocks
                                                 engine.step() -> outputs of one step
    stream queues <--call_soon_threadsafe(dispatch, outputs)-- on_core_event

The step loop never runs on the event loop. ``RequestOutput`` values reaching a consumer
are cumulative (a core in another process sends token deltas; ``engine/core/deltas.py``
detokenizes and adds them up per stream, here), so a consumer that falls behind reads only
the newest output (``generate`` coalesces).

Back-pressure: at most ``max_waiting`` requests may be admitted but not yet producing
output; past that ``generate`` raises ``EngineOverloaded`` before anything is queued
(the server answers 503 with ``Retry-After``).

A core that dies (its step raised, its process exited) fails every in-flight request and
every new one with ``EngineDeadError`` (a 503) and calls ``on_dead(message)`` once.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from tamis.engine.core.deltas import OutputMerger, core_params, wants_merging
from tamis.engine.core.process import ProcessCore
from tamis.engine.core.thread import ThreadCore

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
    """One request's queue on the event loop, plus its timing. ``merger`` rebuilds
    cumulative outputs when the core sends deltas."""

    def __init__(self, loop: asyncio.AbstractEventLoop, merger: OutputMerger | None):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.times = RequestTimes()
        self.started = False  # produced at least one output
        self.ended = False    # its finished output is queued
        self.merger = merger


class AsyncEngine:
    """Async front of an engine core; see the module docstring.

    ``engine``: an ``LLMEngine`` (or anything with its step interface), then run by a
    ``ThreadCore`` in this process; or a core not started yet (``ThreadCore``,
    ``ProcessCore``), which this starts. ``self.engine`` is the engine (``CoreInfo`` for a
    core in another process: config, tokenizer, ``max_model_len``, ``eos_token_ids``).

    ``generate(prompt, params, request_id)`` is an async iterator of cumulative
    ``RequestOutput`` values ending with one whose ``finished`` is true. It raises
    ``EngineOverloaded`` (queue full), ``RequestFailed`` (``add_request`` raised
    ``ValueError`` or the output finished with ``finish_reason == "error"``) and
    ``EngineDeadError``. Leaving the iterator early (break, cancellation, client gone)
    aborts the request, which frees its KV blocks at the next step.
    """

    def __init__(self, engine, max_waiting: int | None = 1024, on_finished=None,
                 on_aborted=None, on_dead=None):
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.core = engine if isinstance(engine, (ThreadCore, ProcessCore)) else ThreadCore(engine)
        self.max_waiting = max_waiting
        self.on_finished = on_finished  # (RequestOutput, RequestTimes) on the event loop
        self.on_aborted = on_aborted    # (request_id) on the event loop
        self.on_dead = on_dead          # (message) on the core's thread, once
        self._streams: dict[str, _Stream] = {}
        self._dead: str | None = None
        self._num_not_started = 0
        self.last_stats = None
        self.core.start(self.on_core_event)

    # ---- public API (event loop side) ----

    @property
    def engine(self):
        return self.core.engine

    @property
    def tokenizer(self):
        return self.core.engine.tokenizer

    @property
    def is_alive(self) -> bool:
        return self._dead is None and self.core.is_alive

    @property
    def dead_reason(self) -> str | None:
        """Why the core stopped serving (None while it serves)."""
        return self._dead

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    async def generate(self, prompt: str | list[int], params,
                       request_id: str, priority: int = 0) -> AsyncIterator[Any]:
        merger = None
        if self.core.remote and wants_merging(params):
            # Outputs come as token deltas, made into text and cumulative outputs here.
            merger = OutputMerger(params, self.tokenizer)
            params = core_params(params, detokenize_here=self.tokenizer is not None)
        stream = self._admit(request_id, merger)
        self.core.send(("add", request_id, prompt, params, priority))
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
        self.core.send(("abort", request_id))
        if self.on_aborted is not None:
            self.on_aborted(request_id)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the core (aborting every in-flight request) and waits for it."""
        self.core.shutdown(timeout)
        err = EngineDeadError("the server is shutting down")
        for request_id, stream in list(self._streams.items()):
            _call_soon(stream.loop, stream.queue.put_nowait, err)
            self._streams.pop(request_id, None)

    def check_health(self) -> None:
        if not self.is_alive:
            raise EngineDeadError(f"engine is not running: {self._dead or 'stopped'}")

    # ---- event-loop bookkeeping ----

    def _admit(self, request_id: str, merger: OutputMerger | None) -> _Stream:
        self.check_health()
        if request_id in self._streams:
            raise RequestFailed(f"request id {request_id!r} is already in flight")
        if self.max_waiting is not None and self._num_not_started >= self.max_waiting:
            raise EngineOverloaded(
                f"{self._num_not_started} requests are already waiting (--max-waiting "
                f"{self.max_waiting}); retry later")
        stream = _Stream(asyncio.get_running_loop(), merger)
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
            if stream is None or stream.ended:
                continue  # aborted meanwhile, or ended by a stop string found here
            if not stream.started:
                stream.started = True
                self._num_not_started -= 1
            if stream.merger is not None:
                delta, output = output, stream.merger.merge(output)
                if output.finished and not delta.finished:   # a stop string, found here
                    self.core.send(("abort", output.request_id))
            stream.ended = output.finished
            stream.queue.put_nowait(output)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        """Runs on the event loop: ends one request with an exception."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        if not stream.started:
            self._num_not_started -= 1
        stream.queue.put_nowait(exc)

    # ---- the core's events (on the core's thread or relay thread) ----

    def on_core_event(self, event: tuple) -> None:
        """Takes one event of the core (``engine/core/loop.py``) to the event loops."""
        kind = event[0]
        if kind == "outputs":
            self.last_stats = event[2] if event[2] is not None else self.last_stats
            self._route(event[1])
        elif kind == "stats":
            self.last_stats = event[1] if event[1] is not None else self.last_stats
        elif kind == "failed":
            _, request_id, message, request_fault = event
            exc = RequestFailed(message) if request_fault else RuntimeError(message)
            self._call_on_loop(request_id, self._fail, request_id, exc)
        elif kind == "dead":
            self._die(event[1])

    def _route(self, outputs) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append(output)
        for loop, batch in by_loop.items():
            _call_soon(loop, self._dispatch, batch)

    def _die(self, message: str) -> None:
        if self._dead is not None:
            return
        self._dead = message
        exc = EngineDeadError(message)
        for request_id, stream in list(self._streams.items()):
            _call_soon(stream.loop, self._fail, request_id, exc)
        if self.on_dead is not None:
            try:
                self.on_dead(message)
            except Exception:
                logger.exception("on_dead callback failed")

    def _call_on_loop(self, request_id: str, fn, *args) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            _call_soon(stream.loop, fn, *args)


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
