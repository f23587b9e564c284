"""Starting the server: the port is taken before the model loads, and probes answer meanwhile.

::

    bind_listening_socket(host, port)    fails at once, naming the port, when it is taken
    serve_while_loading(sock, build, ...)
        uvicorn serves a LoadingGate on the socket at once;
        a daemon thread runs build() (engine + FastAPI app: the slow part)
        while it runs:  /health 200 (liveness), /ready and /readyz 503, any other path 503
        once it is done: every request goes to the built app (its lifespan entered here)
        if it fails:    the server stops and serve_while_loading raises SystemExit
        once opened, the app's ``state.stop_server()`` stops the server the same way
        (the serve command calls it when the engine core dies)

``/health`` answers 200 while the process is alive and its engine is not dead (liveness);
``/ready`` (and ``/readyz``, the names of vLLM's data-parallel supervisor) answer 200 only
once the model is loaded and the step loop runs (readiness).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import threading
from typing import Callable

logger = logging.getLogger("tamis.server")

LIVENESS_PATH = "/health"
READINESS_PATHS = ("/ready", "/readyz")


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; SystemExit naming the port when
    another process holds it or the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Reusing a port left in TIME_WAIT by a previous run is fine; a listening one still fails.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SystemExit(f"tamis serve: port {port} on {host} is already in use by another "
                             f"process; stop it or choose another --port") from None
        raise SystemExit(f"tamis serve: cannot listen on {host}:{port} ({exc.strerror}); "
                         f"check --host and --port") from None
    return sock


class LoadingGate:
    """ASGI app standing in front of the real one while ``build()`` makes it.

    ``build`` runs once, in a daemon thread (so a SIGTERM during a long load still ends
    the process), after the ASGI lifespan starts. ``failure`` holds what it raised.
    """

    def __init__(self, build: Callable[[], object], on_failure: Callable[[], None]):
        self._build = build
        self._on_failure = on_failure
        self._lifespans = contextlib.AsyncExitStack()
        self._opening: asyncio.Task | None = None
        self.app = None
        self.failure: BaseException | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await _answer_while_loading(scope["path"], send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._start_loading()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._lifespans.aclose()   # the built app's shutdown: stops the engine
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _start_loading(self) -> None:
        loop = asyncio.get_running_loop()
        built: asyncio.Future = loop.create_future()

        def run() -> None:
            try:
                result = (self._build(), None)
            except BaseException as exc:  # noqa: BLE001 - reported, then the server stops
                result = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop closed: shutting down anyway
                loop.call_soon_threadsafe(_settle, built, result)

        threading.Thread(target=run, name="tamis-load", daemon=True).start()
        self._opening = loop.create_task(self._open(built))

    async def _open(self, built: asyncio.Future) -> None:
        app, failure = await built
        if failure is None:
            try:
                await self._lifespans.enter_async_context(app.router.lifespan_context(app))
            except Exception as exc:  # noqa: BLE001 - same fate as a failed load
                failure = exc
        if failure is not None:
            self.failure = failure
            self._on_failure()
            return
        app.state.stop_server = self._on_failure   # for a component that fails later
        self.app = app
        logger.info("model loaded: %s answers 200", READINESS_PATHS[0])


def _settle(future: asyncio.Future, result) -> None:
    if not future.done():
        future.set_result(result)


async def _answer_while_loading(path: str, send) -> None:
    if path == LIVENESS_PATH:
        status, body = 200, b""
    else:
        message = ("the model is still loading; retry when "
                   f"{READINESS_PATHS[0]} answers 200")
        status = 503
        body = json.dumps({"error": {"message": message, "type": "service_unavailable_error",
                                     "param": None, "code": "model_loading"}}).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    if status == 503:
        headers += [(b"content-type", b"application/json"), (b"retry-after", b"5")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_while_loading(sock: socket.socket, build: Callable[[], object],
                        **uvicorn_options) -> None:
    """Serves ``build()``'s app on ``sock``, answering probes while it is built; returns when
    the server stops (SIGTERM/SIGINT). SystemExit when ``build`` fails, with its message."""
    import uvicorn

    server: uvicorn.Server | None = None

    def stop() -> None:
        server.should_exit = True

    gate = LoadingGate(build, on_failure=stop)
    server = uvicorn.Server(uvicorn.Config(gate, lifespan="on", **uvicorn_options))
    server.run(sockets=[sock])
    if gate.failure is not None:
        failure = gate.failure
        if isinstance(failure, SystemExit):
            raise failure
        logger.error("loading the model failed", exc_info=failure)
        raise SystemExit(f"tamis serve: loading the model failed: {failure}")
