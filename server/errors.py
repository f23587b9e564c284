"""OpenAI error bodies and the status each failure maps to.

Every error the server answers has OpenAI's shape::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

``APIError`` is raised anywhere below the route handlers; ``install_error_handlers``
turns it, FastAPI's request-validation errors (422 there, 400 here, as OpenAI answers),
HTTP errors (404 route, 405) and engine errors into that body. A client mistake never
becomes a 500: only a bug or a dead engine does.
"""
from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from tamis.engine.async_engine import EngineDeadError, EngineOverloaded, RequestFailed

logger = logging.getLogger("tamis.server")

# OpenAI answers client mistakes (400, 401, 404) with type "invalid_request_error".
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable_error",
}


class _ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """OpenAI's error response body."""
    error: _ErrorDetail


# What the API routes answer besides 200, for openapi.json.
ERROR_RESPONSES = {
    400: {"model": ErrorBody, "description": "A field of the request is wrong (``param`` "
                                             "names it), or the constraint cannot compile"},
    401: {"model": ErrorBody, "description": "Missing or wrong API key (--api-key)"},
    404: {"model": ErrorBody, "description": "The request names a model not served here"},
    413: {"model": ErrorBody, "description": "The body is larger than --max-request-body-bytes"},
    503: {"model": ErrorBody, "description": "Overloaded (Retry-After), engine down, or a "
                                             "constraint past --structured-outputs-time-limit"},
}


class APIError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI error fields."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error")


def invalid(message: str, param: str | None = None) -> APIError:
    """400 for a parameter the request got wrong."""
    return APIError(message, 400, param=param, code="invalid_value" if param else None)


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.message, err.type, err.param, err.code),
                        status_code=err.status, headers=err.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestFailed, _on_engine_error)
    app.add_exception_handler(EngineOverloaded, _on_engine_error)
    app.add_exception_handler(EngineDeadError, _on_engine_error)
    app.add_exception_handler(Exception, _on_unexpected)


async def _on_api_error(_request: Request, exc: APIError) -> JSONResponse:
    return error_response(exc)


async def _on_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(exc.errors()))


def validation_error(errors) -> APIError:
    """First pydantic error as an OpenAI 400 naming the field (``param``)."""
    if not errors:
        return invalid("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":   # loc holds the character position, not a field
        position = next((p for p in first.get("loc", ()) if isinstance(p, int)), None)
        where = f" at character {position}" if position is not None else ""
        return APIError(f"the request body is not valid JSON{where}: "
                        f"{(first.get('ctx') or {}).get('error', first.get('msg', ''))}", 400)
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid value")
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error(s))"
    return APIError(message, 400, param=param, code="invalid_value")


def engine_error(exc: Exception) -> APIError:
    """Engine exceptions: refused request 400, a compile past the time limit 503, full
    queue 503 + Retry-After, dead 503."""
    if isinstance(exc, RequestFailed) and exc.code == "compile_time_limit":
        # A limit of this server, not a wrong request: 503, and worth a retry (slow
        # compiles are not cached; a less busy server may finish it).
        return APIError(str(exc), 503, code="compile_time_limit", type="server_error")
    if isinstance(exc, RequestFailed):
        return APIError(str(exc), 400)
    if isinstance(exc, EngineOverloaded):
        return APIError(str(exc), 503, code="overloaded", headers={"Retry-After": "1"})
    return APIError(str(exc), 503, code="engine_unavailable")


async def _on_engine_error(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(engine_error(exc))


async def _on_http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "error"
    message = exc.detail if isinstance(exc.detail, str) else phrase
    return error_response(APIError(message, exc.status_code,
                                   headers=getattr(exc, "headers", None)))


async def _on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.exception("internal error: %s", exc)
    return error_response(APIError(f"internal server error: {type(exc).__name__}: {exc}",
                                   500, type="server_error"))
