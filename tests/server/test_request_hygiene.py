"""Hostile or departing clients: the access log stays one line per request, and a client
that leaves cancels its handler quietly."""
import asyncio
import logging

from tamis.server.access_log import AccessLogMiddleware, printable


def test_control_characters_are_escaped():
    assert printable("/v1/models") == "/v1/models"
    assert printable("/x\nINFO forged line\r") == "/x\\nINFO forged line\\r"
    assert printable("id\x1b[31m") == "id\\x1b[31m"


def test_a_forged_line_stays_on_its_own_line(caplog):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        pass

    scope = {"type": "http", "method": "GET", "path": "/a\n1234 GET /admin status=200",
             "headers": [(b"x-request-id", b"r1\nfake")]}
    with caplog.at_level(logging.INFO, logger="tamis.server.access"):
        asyncio.run(AccessLogMiddleware(app)(scope, None, send))
    (record,) = caplog.records
    assert "\n" not in record.getMessage()
    assert "status=404" in record.getMessage() and "r1" not in record.getMessage()


def test_a_client_leaving_cancels_the_handler_quietly():
    from tamis.server.streaming import cancel_on_disconnect
    cleaned = []

    class Gone:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def handler():
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)   # where the engine requests are aborted

    assert asyncio.run(cancel_on_disconnect(Gone(), handler())) is None
    assert cleaned == [True]
