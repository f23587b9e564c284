"""The FastAPI application: routes, middleware, lifespan.

``build_app(ctx, api_key=None, max_body_bytes=...)`` wires a ``ServerContext`` (engine,
tokenizer, names) into the routes. Middleware, outermost first: access log (one line
per request), body-size limit (413), API key (401 on ``/v1/*``). ``/health`` (liveness) and
``/ready`` (readiness) answer 200 while the engine's step loop runs, 503 once it died. Shutting the app down
(uvicorn on SIGTERM/SIGINT, after in-flight responses drain) stops the engine core (its
thread or process), aborting whatever is still running.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tamis.server.access_log import AccessLogMiddleware
from tamis.server.auth import ApiKeyMiddleware, BodyLimitMiddleware
from tamis.server.chat import create_chat_completion, render_chat
from tamis.server.completions import create_completion
from tamis.server.context import ServerContext
from tamis.server.errors import ERROR_RESPONSES, APIError, install_error_handlers
from tamis.server.metrics import ServerMetrics
from tamis.server.protocol import (ChatCompletionRequest, CompletionRequest,
                                   DetokenizeRequest, TokenizeRequest)
from tamis.server.streaming import cancel_on_disconnect

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


def tamis_version() -> str:
    try:
        return importlib.metadata.version("tamis")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_app(ctx: ServerContext, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              metrics_namespace: str = "tamis") -> FastAPI:
    if ctx.metrics is None:
        ctx.metrics = ServerMetrics(ctx.engine, ctx.model_name, ctx.max_model_len,
                                    namespace=metrics_namespace)
    ctx.engine.on_finished = ctx.metrics.observe_finished
    ctx.engine.on_aborted = ctx.metrics.observe_abort

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        ctx.engine.shutdown()

    app = FastAPI(title="tamis", version=tamis_version(),
                  lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app)
    _document_validation_as_400(app)
    _add_routes(app, ctx)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(AccessLogMiddleware, on_status=ctx.metrics.observe_error)
    return app


def _model_card(ctx: ServerContext, name: str) -> dict:
    return {"id": name, "object": "model", "created": ctx.created, "owned_by": "tamis",
            "max_model_len": ctx.max_model_len}


def _add_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.get("/health")
    async def health():
        """Liveness: 200 while the engine core runs."""
        return _engine_status(ctx)

    @app.get("/ready")
    @app.get("/readyz")
    async def ready():
        """Readiness: this app exists once the model is loaded, so the same as liveness here
        (``tamis.server.startup`` answers 503 while it loads)."""
        return _engine_status(ctx)

    @app.get("/version")
    async def version():
        return {"version": tamis_version()}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(ctx, n) for n in ctx.model_names]}

    @app.get("/v1/models/{model:path}", responses={404: ERROR_RESPONSES[404]})
    async def get_model(model: str):
        ctx.check_model(model)
        return _model_card(ctx, model)

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest, raw: Request):
        return await _guarded(raw, create_completion(ctx, body, raw))

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        return await _guarded(raw, create_chat_completion(ctx, body, raw))

    @app.post("/tokenize", responses=ERROR_RESPONSES)
    async def tokenize(body: TokenizeRequest):
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("send exactly one of `prompt` or `messages`", 400, param="prompt")
        if body.messages is not None:
            text, special = render_chat(ctx, _ChatView(body)), False
        else:
            text, special = body.prompt, body.add_special_tokens
        # Off the event loop: a long text takes seconds to tokenize.
        ids = await asyncio.to_thread(ctx.tokenizer.encode, text, add_special_tokens=special)
        return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids}

    @app.post("/detokenize", responses=ERROR_RESPONSES)
    async def detokenize(body: DetokenizeRequest):
        ctx.check_model(body.model)
        ctx.check_token_ids(body.tokens, "tokens")
        return {"prompt": ctx.tokenizer.decode(body.tokens)}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _engine_status(ctx: ServerContext) -> Response:
    if not ctx.engine.is_alive:
        raise APIError("the engine is not running", 503, code="engine_unavailable")
    return Response(status_code=200)


class _ChatView:
    """A /tokenize body seen as the chat fields ``render_chat`` reads."""

    def __init__(self, body: TokenizeRequest):
        self.messages = body.messages
        self.add_generation_prompt = body.add_generation_prompt
        self.continue_final_message = False
        self.tools = None
        self.chat_template_kwargs = None


async def _guarded(raw: Request, handler):
    """Runs a generation handler, aborting it if the client disconnects first."""
    response = await cancel_on_disconnect(raw, handler)
    if response is None:  # the client is gone; nobody reads this
        return JSONResponse({}, status_code=499)
    return response


def _document_validation_as_400(app: FastAPI) -> None:
    """FastAPI documents a 422 for bad bodies; this server answers those with OpenAI's 400."""
    build = app.openapi

    def openapi() -> dict:
        spec = build()
        for operations in spec.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        return spec
    app.openapi = openapi
