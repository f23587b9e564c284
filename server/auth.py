"""ASGI middleware at the edge: API-key check and request-body size limit.

Pure ASGI (not ``BaseHTTPMiddleware``) so streaming responses and client-disconnect
messages pass through untouched.

- ``ApiKeyMiddleware``: with a key set, every ``/v1/*`` path needs
  ``Authorization: Bearer <key>`` (as vLLM), compared in constant time; 401 with an
  OpenAI error body otherwise. ``/health``, ``/version`` and ``/metrics`` stay open for
  probes and scrapers; ``/tokenize`` and ``/detokenize`` also need the key.
- ``BodyLimitMiddleware``: a body over ``max_bytes`` (declared or streamed) is a 413.
"""
from __future__ import annotations

import hmac
import json

from tamis.server.errors import error_body


async def _send_error(send, status: int, message: str, type: str, code: str | None,
                      headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(error_body(message, type, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _protected(scope["path"]):
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", ())).get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            return await self.app(scope, receive, send)
        message = ("Missing API key: send `Authorization: Bearer <key>`" if not given
                   else "Incorrect API key provided")
        await _send_error(send, 401, message, "invalid_request_error", "invalid_api_key",
                          [(b"www-authenticate", b"Bearer")])


def _protected(path: str) -> bool:
    return path.startswith("/v1") or path in ("/tokenize", "/detokenize")


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send):
        await _send_error(send, 413, f"request body is larger than the limit of "
                          f"{self.max_bytes} bytes (--max-request-body-bytes)",
                          "invalid_request_error", "request_too_large")
