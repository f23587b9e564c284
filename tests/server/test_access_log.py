"""server/access_log.py: one line per request, whatever the client puts in its path or id."""
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
