"""One log line per HTTP request: id, method, path, status, tokens, latency.

Pure ASGI middleware. It gives each request an id (the client's ``X-Request-Id`` or a
new one), stores it in ``scope["state"]["request_id"]`` for the handlers (which may
replace it with the body's ``request_id``), echoes it in the response header, and logs
after the last body byte, so a streamed response is logged when it ends. Handlers add
token counts to ``scope["state"]["usage"]``.
"""
from __future__ import annotations

import logging
import time
import uuid

logger = logging.getLogger("tamis.server.access")
# Probes and scrapers: logged at DEBUG when fine.
_QUIET_PATHS = ("/health", "/ready", "/readyz", "/metrics")


def printable(text: str) -> str:
    """``text`` with control characters escaped: a client's path or request id (``%0a``
    decodes to a newline) cannot start a forged line of the log."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class AccessLogMiddleware:
    def __init__(self, app, on_status=None):
        self.app = app
        self.on_status = on_status  # called with the status of every answered request

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")
        if not (request_id.isprintable() and 0 < len(request_id) <= 256):
            request_id = uuid.uuid4().hex   # echoed in a header: none with control characters
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        start = time.monotonic()
        status = 0

        async def logging_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"],
                                      (b"x-request-id", state["request_id"].encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, logging_send)
        finally:
            self._log(scope, state, state["request_id"], status, time.monotonic() - start)

    def _log(self, scope, state, request_id, status, elapsed) -> None:
        usage = state.get("usage") or {}
        tokens = (f" prompt_tokens={usage.get('prompt_tokens', 0)}"
                  f" completion_tokens={usage.get('completion_tokens', 0)}" if usage else "")
        status_text = status or "disconnected"
        quiet = scope.get("path") in _QUIET_PATHS and status == 200
        logger.log(logging.DEBUG if quiet else logging.INFO, "%s %s %s status=%s%s latency=%.3fs",
                   printable(request_id), printable(scope.get("method") or ""),
                   printable(scope.get("path") or ""), status_text, tokens, elapsed)
        if self.on_status is not None and status >= 400:
            self.on_status(status)
