"""``POST /v1/chat/completions``.

Messages go through the model's chat template, or the request's ``chat_template`` when
the server trusts request templates (``--trust-request-chat-template``, as vLLM), with
``add_generation_prompt``, ``continue_final_message`` and ``chat_template_kwargs`` as in
vLLM; the rendered text is tokenized without adding special tokens again, then
``truncate_prompt_tokens`` applies. ``echo`` prepends the last message's content when it
has the role being answered (vLLM's rule); ``return_token_ids`` adds ``prompt_token_ids``
(first chunk when streaming) and each choice's ``token_ids``; ``prompt_logprobs`` come back
beside the choices. ``max_completion_tokens`` wins over the
older ``max_tokens``; both unset means "until the context is full". Tools follow
``server.tools``; the constraint a tool choice needs is merged with
``structured_outputs`` / ``response_format`` by ``server.structured`` (only one may be set).
"""
from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tamis.server.beam import beam_search_outputs
from tamis.server.chat_writer import ChatWriter
from tamis.server.context import ServerContext
from tamis.server.errors import invalid
from tamis.server.fields import check_request_fields, request_ids
from tamis.server.protocol import ChatCompletionRequest
from tamis.server.sampling import (build_sampling_params, check_stream_options, engine_prompt,
                                   max_tokens_for, truncate_prompt)
from tamis.server.streaming import merge, start_generations
from tamis.server.structured import resolve_structured_outputs
from tamis.server.tools import apply_legacy_functions, legacy_message, plan_tools

# apply_chat_template's own arguments: set by the request's fields, not its kwargs.
_RESERVED_TEMPLATE_KWARGS = {"conversation", "messages", "tools", "chat_template", "tokenize",
                             "add_generation_prompt", "continue_final_message"}


def render_chat(ctx: ServerContext, body) -> str:
    """The prompt text for ``body.messages``; 400 if the template refuses them."""
    template = _template(ctx, getattr(body, "chat_template", None))
    kwargs = body.chat_template_kwargs or {}
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise invalid(f"chat_template_kwargs may not set {reserved}: they are request fields "
                      f"of their own", "chat_template_kwargs")
    if not template:
        raise invalid("the served model has no chat template; use /v1/completions",
                      "messages")
    if body.continue_final_message and body.add_generation_prompt:
        raise invalid("continue_final_message and add_generation_prompt cannot both be "
                      "true; set add_generation_prompt to false", "continue_final_message")
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    try:
        return ctx.tokenizer.apply_chat_template(
            [_template_message(m) for m in body.messages], tools=tools, tokenize=False,
            chat_template=template, add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message, **kwargs)
    except Exception as exc:  # jinja raises many types; all mean "these messages"
        raise invalid(f"the chat template could not render these messages: {exc}",
                      "messages") from exc


def _template(ctx: ServerContext, requested: str | None) -> str | None:
    if requested is None:
        return getattr(ctx.tokenizer, "chat_template", None)
    if not ctx.trust_request_chat_template:
        raise invalid("this server does not run request chat templates: restart it with "
                      "--trust-request-chat-template, or drop `chat_template`", "chat_template")
    return requested


def _template_message(message) -> dict:
    out = legacy_message(message.model_dump(exclude_none=True))
    out["content"] = _content_text(message.content)
    for call in out.get("tool_calls") or []:
        function = call.get("function") or {}
        if isinstance(function.get("arguments"), str):
            try:  # templates index into arguments; vLLM hands them a dict too
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass
    return out


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") not in ("text", "input_text"):
            raise invalid(f"message content of type {part.get('type')!r} is not supported "
                          f"(text only)", "messages")
        texts.append(part.get("text", ""))
    return "\n".join(texts)


def echoed_text(body) -> str:
    """What ``echo`` prepends: the last message's text when it has the role being answered
    (the assistant with ``add_generation_prompt``, else the last message's own role)."""
    if not body.echo:
        return ""
    last = body.messages[-1]
    role = "assistant" if body.add_generation_prompt else last.role
    return _content_text(last.content) if last.role == role else ""


def chat_logprobs_count(ctx: ServerContext, body: ChatCompletionRequest) -> int | None:
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs to be true", "top_logprobs")
    ctx.check_logprobs(body.top_logprobs, "top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


async def create_chat_completion(ctx: ServerContext, body: ChatCompletionRequest,
                                 raw: Request):
    model = ctx.check_model(body.model)
    check_request_fields(ctx, body)
    check_stream_options(body)
    legacy = apply_legacy_functions(body)
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    constraint = resolve_structured_outputs(body, plan.schema)
    if ctx.metrics is not None:
        ctx.metrics.observe_constraint(constraint)
    logprobs = chat_logprobs_count(ctx, body)
    budget, param = ((body.max_completion_tokens, "max_completion_tokens")
                     if body.max_completion_tokens is not None else
                     (body.max_tokens, "max_tokens"))
    prompt_ids = await ctx.encode(render_chat(ctx, body), "messages",
                                  truncated=body.truncate_prompt_tokens is not None,
                                  add_special_tokens=body.add_special_tokens)
    prompt_ids = truncate_prompt(prompt_ids, body, budget, ctx.max_model_len)
    max_tokens = max_tokens_for(budget, len(prompt_ids), ctx.max_model_len, param, "messages")
    response_id, engine_id = request_ids(raw, body, "chatcmpl")
    writer = ChatWriter(ctx, body, model, response_id, plan, prompt_ids, raw, legacy,
                        echo=echoed_text(body))
    if body.use_beam_search:
        [output] = await beam_search_outputs(ctx, body, [(prompt_ids, max_tokens)], engine_id,
                                             logprobs, constraint)
        return JSONResponse(writer.response(output))
    params = build_sampling_params(body, max_tokens=max_tokens, logprobs=logprobs,
                                   structured_outputs=constraint)
    gens = await start_generations(ctx.engine, [(engine_id, engine_prompt(prompt_ids, body),
                                                 params, body.priority)])
    if body.stream:
        return StreamingResponse(writer.stream(gens), media_type="text/event-stream")
    final = None
    async for _, output in merge(gens):
        final = output
    return JSONResponse(writer.response(final))
