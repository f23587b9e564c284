"""Server-sent events and the plumbing around a streamed generation.

- ``sse(obj)`` frames one JSON chunk (``data: {...}\\n\\n``); ``SSE_DONE`` ends a stream.
- ``start_generations`` starts several engine generations and awaits each one's first
  output, so a request the engine refuses becomes a 400 before any byte is streamed.
- ``merge`` interleaves several generations as ``(index, output)``.
- ``sse_body`` is the streamed body both endpoints share: chunks, the error event, the
  closing usage chunk and ``[DONE]``, with every request aborted when the body ends.
- ``cancel_on_disconnect`` runs a handler while watching the connection; a client that
  leaves cancels the handler, which aborts its engine requests at once.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Iterable

from fastapi import Request

from tamis.server.errors import error_body

SSE_DONE = "data: [DONE]\n\n"


class Cursor:
    """How much of one choice's cumulative output a stream has already sent."""

    def __init__(self):
        self.text = 0       # characters of text sent
        self.tokens = 0     # token ids sent
        self.started = False
        self.done = False   # the finish_reason chunk was sent

    def has_news(self, choice) -> bool:
        return (not self.started or len(choice.text) > self.text
                or choice.finish_reason is not None)

    def advance(self, choice) -> str:
        """Marks the choice sent up to now; returns its new text."""
        new_text = choice.text[self.text:]
        self.text, self.tokens = len(choice.text), len(choice.token_ids)
        self.started = True
        self.done = choice.finish_reason is not None
        return new_text


def stream_error(exc: BaseException) -> dict:
    """The error event sent when a stream fails after its first byte."""
    from tamis.engine.async_engine import RequestFailed

    kind = ("invalid_request_error" if isinstance(exc, RequestFailed) and exc.code is None
            else "server_error")
    return error_body(str(exc) or type(exc).__name__, kind)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def sse_body(gens: list["Generation"], chunks: Callable[[int, Any], Iterable[dict]],
                   closing_chunk: Callable[[], dict | None]) -> AsyncIterator[str]:
    """Frames a streamed generation. ``chunks(index, output)`` turns each merged output into
    zero or more chunk dicts; after the last output, ``closing_chunk()`` gives the usage chunk
    to send (or None). A failure after the status line went out becomes one error event and
    ``[DONE]``. Every request is aborted when the body ends for any reason, so a client that
    left frees its KV blocks now, not when the generator is garbage-collected."""
    try:
        async for index, output in merge(gens):
            for chunk in chunks(index, output):
                yield sse(chunk)
    except Exception as exc:  # noqa: BLE001 - the status line is already sent
        yield sse(stream_error(exc))
        yield SSE_DONE
        return
    finally:
        for gen in gens:
            gen.abort()
    closing = closing_chunk()
    if closing is not None:
        yield sse(closing)
    yield SSE_DONE


class Generation:
    """One engine request: its id, its output iterator and the first output."""

    def __init__(self, engine, request_id: str, iterator: AsyncIterator):
        self.engine = engine
        self.request_id = request_id
        self.iterator = iterator
        self.first = None

    async def prime(self) -> None:
        self.first = await anext(self.iterator)

    async def outputs(self) -> AsyncIterator:
        yield self.first
        if self.first.finished:
            return
        async for output in self.iterator:
            yield output

    def abort(self) -> None:
        self.engine.abort(self.request_id)


async def start_generations(engine, jobs: list[tuple[str, Any, Any, int]]) -> list[Generation]:
    """``jobs`` = [(request_id, prompt, params, priority)]; all primed, or all aborted
    and the first exception raised."""
    gens = [Generation(engine, rid, engine.generate(prompt, params, rid, priority))
            for rid, prompt, params, priority in jobs]
    try:
        await asyncio.gather(*(g.prime() for g in gens))
    except BaseException:
        for g in gens:
            g.abort()
        raise
    return gens


async def merge(gens: list[Generation]) -> AsyncIterator[tuple[int, Any]]:
    """Yields ``(index, output)`` from every generation as outputs arrive."""
    if len(gens) == 1:
        async for output in gens[0].outputs():
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, gen: Generation) -> None:
        try:
            async for output in gen.outputs():
                await queue.put((index, output))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, exc))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(gens)
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for g in gens:
            g.abort()


async def cancel_on_disconnect(request: Request, handler):
    """Awaits ``handler`` (a coroutine); if the client disconnects first, cancels it
    (its engine requests are aborted by their ``finally``) and returns None."""
    work = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        watcher.cancel()
    if not work.done() or work.cancelled():
        # A cancelled task is done only once it ran its cleanup: wait for that, quietly
        # (reading its result before then raised InvalidStateError, logged as an ERROR).
        await asyncio.gather(work, return_exceptions=True)
        return None
    return work.result()


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
