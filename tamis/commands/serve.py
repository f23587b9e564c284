"""`tamis serve [MODEL]`: the OpenAI-compatible HTTP server.

No MODEL serves the embedded SmolLM2-135M-Instruct. Every engine flag of
``tamis.engine.arg_utils.add_engine_args`` applies (``--max-model-len``, ``--dtype``,
``--load-format dummy``, ...). The key comes from ``--api-key`` or ``TAMIS_API_KEY``.
SIGTERM / SIGINT: uvicorn stops accepting connections, lets in-flight responses finish
for up to ``--shutdown-timeout`` seconds, then the engine thread aborts whatever is left.
The port is taken before torch or the model loads (a busy port fails at once); while it loads,
``/health`` answers 200 and ``/ready`` 503 (``tamis.server.startup``).

The engine core (scheduler, KV cache, structured outputs, model) runs in a child process
(``tamis.engine.core.process``); this process keeps HTTP, tokenization and streaming.
``--no-engine-process`` runs the core as a thread of this process instead. When the core
dies, in-flight and new requests get 503, the server stops and the command exits with 1,
so a supervisor restarts it.
"""
from __future__ import annotations

import argparse
import logging
import os

DEFAULT_MAX_WAITING = 1024

logger = logging.getLogger("tamis.server")


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("serve", help="run the OpenAI-compatible server",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="HF model folder, .gguf file or Hub model id such as "
                             "Qwen/Qwen2.5-0.5B-Instruct (default: embedded SmolLM2)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--api-key", default=None,
                        help="require `Authorization: Bearer KEY` on /v1/* "
                             "(default: $TAMIS_API_KEY)")
    server.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    server.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                        help="requests admitted but not yet generating before new ones "
                             "get 503 + Retry-After")
    server.add_argument("--max-request-body-bytes", type=int, default=32 * 1024 * 1024,
                        help="larger request bodies get 413")
    server.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds in-flight requests get to finish on SIGTERM")
    server.add_argument("--metrics-namespace", default="tamis", choices=("tamis", "vllm"),
                        help="prefix of the /metrics names: `vllm` serves vLLM's names "
                             "(vllm:num_requests_running, ...) for its dashboards")
    server.add_argument("--reject-unknown-fields", action="store_true",
                        help="answer a request holding a field the API does not know with "
                             "400 naming it (default: served, the field logged once)")
    server.add_argument("--trust-request-chat-template", action="store_true",
                        help="let chat requests bring their own `chat_template` (default: "
                             "refused with 400, as vLLM)")
    server.add_argument("--no-engine-process", action="store_true",
                        help="run the engine core as a thread of the server process (its "
                             "steps then share the GIL with HTTP) instead of a process of "
                             "its own")
    from tamis.engine.arg_utils import add_engine_args

    add_engine_args(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from tamis.server.startup import bind_listening_socket, serve_while_loading

    _setup_logging(args.log_level)
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise SystemExit("tamis serve: give the model either as MODEL or --model, not both")
        args.model = args.model_tag
    api_key = args.api_key or os.environ.get("TAMIS_API_KEY") or None
    sock = bind_listening_socket(args.host, args.port)
    logger.info("listening on http://%s:%d; loading the model", args.host, args.port)
    loaded = []

    def load():
        loaded.append(_load(args, api_key))
        return loaded[0]

    serve_while_loading(sock, load, log_level=args.log_level, access_log=False,
                        timeout_graceful_shutdown=args.shutdown_timeout)
    died = loaded[0].state.ctx.engine.dead_reason if loaded else None
    if died:
        logger.error("tamis serve: stopped because the engine core died: %s", died)
        return 1
    return 0


def _load(args: argparse.Namespace, api_key: str | None):
    from tamis.engine.hub import HubModelError
    from tamis.engine.loader import CheckpointFileError

    try:
        app = build_server_app(args, api_key)
    except (HubModelError, CheckpointFileError) as exc:   # the message says what to do; a
        # traceback would bury it
        raise SystemExit(f"tamis serve: {exc}") from None
    app.state.ctx.engine.on_dead = lambda _message: _stop_server(app)
    logger.info("serving %s on http://%s:%d%s", app.state.ctx.model_names, args.host,
                args.port, " (API key required)" if api_key else "")
    return app


def _stop_server(app) -> None:
    """The engine core died: stop serving (in-flight requests already got their 503)."""
    stop = getattr(app.state, "stop_server", None)
    if stop is not None:
        stop()


def build_server_app(args: argparse.Namespace, api_key: str | None):
    """Engine core from the CLI flags (a process of its own unless ``--no-engine-process``),
    wrapped in an AsyncEngine and the FastAPI app."""
    from tamis.engine.async_engine import AsyncEngine
    from tamis.engine.config import EngineConfig
    from tamis.server.app import build_app
    from tamis.server.context import ServerContext

    config = EngineConfig.from_cli_args(args)
    if config.skip_tokenizer_init:
        raise SystemExit("tamis serve: the server needs the tokenizer (chat templates, text "
                         "prompts, streamed text); drop --skip-tokenizer-init")
    async_engine = AsyncEngine(_make_core(config, args.no_engine_process),
                               max_waiting=args.max_waiting)
    engine = async_engine.engine
    ctx = ServerContext(engine=async_engine, tokenizer=engine.tokenizer,
                        model_names=served_model_names(args),
                        max_model_len=_max_model_len(engine),
                        max_logprobs=getattr(engine.config, "max_logprobs", 20),
                        scheduling_policy=engine.config.scheduling_policy,
                        reject_unknown_fields=args.reject_unknown_fields,
                        trust_request_chat_template=args.trust_request_chat_template)
    return build_app(ctx, api_key=api_key, max_body_bytes=args.max_request_body_bytes,
                     metrics_namespace=args.metrics_namespace)


def _make_core(config, in_process: bool):
    if in_process:
        from tamis.engine.core import ThreadCore
        from tamis.engine.engine import LLMEngine

        return ThreadCore(LLMEngine(config))
    from tamis.engine.core import ProcessCore

    return ProcessCore.for_config(config)


def served_model_names(args) -> list[str]:
    if args.served_model_name:
        return [name.strip() for name in str(args.served_model_name).split(",") if name.strip()]
    if args.model:
        return [str(args.model).rstrip("/")]
    return ["SmolLM2-135M-Instruct"]


def _max_model_len(engine) -> int:
    value = getattr(engine, "max_model_len", None)  # resolved from the checkpoint and KV size
    if value is None:
        value = getattr(engine.config, "max_model_len", None)
    if value is None:
        value = getattr(engine.hf_config, "max_position_embeddings", 2048)
    return int(value)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
