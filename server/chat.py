"""``POST /v1/chat/completions``.

Messages go through the model's chat template (``add_generation_prompt``,
``continue_final_message``, ``chat_template_kwargs`` as in vLLM); the rendered text is
tokenized without adding special tokens again. ``max_completion_tokens`` wins over the
older ``max_tokens``; both unset means "until the context is full". Tools follow
``server.tools``; the constraint a tool choice needs is merged with
``structured_outputs`` / ``response_format`` by ``server.structured`` (only one may be set).
"""
from __future__ import annotations

import json
import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tamis.server.context import ServerContext, new_id
from tamis.server.errors import invalid
from tamis.server.logprobs import chat_logprobs
from tamis.server.protocol import ChatCompletionRequest
from tamis.server.sampling import (build_sampling_params, check_stream_options,
                                   max_tokens_for)
from tamis.server.streaming import Cursor, merge, sse, sse_body, start_generations
from tamis.server.structured import resolve_structured_outputs
from tamis.server.tools import ToolPlan, ToolStreamer, extract_tool_calls, plan_tools


def render_chat(ctx: ServerContext, body) -> str:
    """The prompt text for ``body.messages``; 400 if the template refuses them."""
    template = getattr(ctx.tokenizer, "chat_template", None)
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
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            **(body.chat_template_kwargs or {}))
    except Exception as exc:  # jinja raises many types; all mean "these messages"
        raise invalid(f"the chat template could not render these messages: {exc}",
                      "messages") from exc


def _template_message(message) -> dict:
    out = message.model_dump(exclude_none=True)
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


def chat_logprobs_count(ctx: ServerContext, body: ChatCompletionRequest) -> int | None:
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs to be true", "top_logprobs")
    ctx.check_logprobs(body.top_logprobs, "top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


async def create_chat_completion(ctx: ServerContext, body: ChatCompletionRequest,
                                 raw: Request):
    model = ctx.check_model(body.model)
    check_stream_options(body)
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    constraint = resolve_structured_outputs(body, plan.schema)
    if ctx.metrics is not None:
        ctx.metrics.observe_constraint(constraint)
    logprobs = chat_logprobs_count(ctx, body)
    prompt_ids = await ctx.encode(render_chat(ctx, body), "messages",
                                  add_special_tokens=body.add_special_tokens)
    budget, param = ((body.max_completion_tokens, "max_completion_tokens")
                     if body.max_completion_tokens is not None else
                     (body.max_tokens, "max_tokens"))
    max_tokens = max_tokens_for(budget, len(prompt_ids), ctx.max_model_len, param, "messages")
    params = build_sampling_params(body, max_tokens=max_tokens, logprobs=logprobs,
                                   structured_outputs=constraint)
    request_id = new_id("chatcmpl")
    gens = await start_generations(ctx.engine, [(request_id, prompt_ids, params,
                                                 body.priority)])
    writer = _ChatWriter(ctx, body, model, request_id, plan, len(prompt_ids), raw)
    if body.stream:
        return StreamingResponse(writer.stream(gens), media_type="text/event-stream")
    final = None
    async for _, output in merge(gens):
        final = output
    return JSONResponse(writer.response(final))


class _ChatWriter:
    """Builds the JSON body or the SSE chunks of one chat request."""

    def __init__(self, ctx, body, model, request_id, plan: ToolPlan, prompt_len, raw):
        self.ctx, self.body, self.model, self.request_id = ctx, body, model, request_id
        self.plan, self.prompt_len, self.raw = plan, prompt_len, raw
        self.created = int(time.time())
        self.top_n = body.top_logprobs or 0

    def _finish_reason(self, choice, made_calls: bool) -> str:
        if made_calls and choice.finish_reason == "stop" and self.plan.mode != "named":
            return "tool_calls"
        return choice.finish_reason

    def _logprobs(self, choice, start: int = 0):
        if not self.body.logprobs:
            return None
        return chat_logprobs(choice.token_ids[start:], (choice.logprobs or [])[start:],
                             self.top_n, self.ctx.token_text)

    def usage(self, output) -> dict:
        completion = sum(len(c.token_ids) for c in output.outputs) if output else 0
        usage = {"prompt_tokens": self.prompt_len, "completion_tokens": completion,
                 "total_tokens": self.prompt_len + completion}
        self.raw.scope.setdefault("state", {})["usage"] = usage
        return usage

    def _envelope(self, choices, object_="chat.completion.chunk") -> dict:
        return {"id": self.request_id, "object": object_, "created": self.created,
                "model": self.model, "choices": choices}

    def response(self, output) -> dict:
        choices = []
        for choice in output.outputs:
            content, calls = extract_tool_calls(self.plan, choice.text)
            message = {"role": "assistant", "content": content, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": choice.index, "message": message,
                            "logprobs": self._logprobs(choice),
                            "finish_reason": self._finish_reason(choice, bool(calls)),
                            "stop_reason": choice.stop_reason})
        body = self._envelope(choices, "chat.completion")
        body["usage"] = self.usage(output)
        return body

    def _chunk(self, choices, output=None) -> dict:
        chunk = self._envelope(choices)
        if self._include_usage:
            options = self.body.stream_options
            chunk["usage"] = (self.usage(output) if options.continuous_usage_stats
                              and output is not None else None)
        return chunk

    @property
    def _include_usage(self) -> bool:
        options = self.body.stream_options
        return options is not None and options.include_usage

    async def stream(self, gens):
        n = self.body.n
        yield sse(self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None} for i in range(n)]))
        cursors = [Cursor() for _ in range(n)]
        streamers = [ToolStreamer(self.plan) for _ in range(n)]
        latest = [None]

        def chunks(_, output):
            latest[0] = output
            choices = []
            for choice in output.outputs:
                choices += self._deltas(choice, cursors[choice.index], streamers[choice.index])
            return [self._chunk(choices, output)] if choices else []

        def closing_chunk():
            usage = self.usage(latest[0])   # also recorded for the access log
            return {**self._envelope([]), "usage": usage} if self._include_usage else None

        async for line in sse_body(gens, chunks, closing_chunk):
            yield line

    def _deltas(self, choice, cursor: Cursor, streamer: ToolStreamer) -> list[dict]:
        """At most one entry for this choice: its new content / tool calls, logprobs,
        and the finish reason once it is done."""
        if cursor.done or not cursor.has_news(choice):
            return []
        logprobs = self._logprobs(choice, cursor.tokens)
        parts = streamer.feed(cursor.advance(choice))
        finish = None
        if cursor.done:
            parts += streamer.finish()
            finish = self._finish_reason(choice, streamer.emitted_calls)
        delta = _merge_parts(parts)
        if not delta and not finish and not (logprobs and logprobs["content"]):
            return []
        entry = {"index": choice.index, "delta": delta, "logprobs": logprobs,
                 "finish_reason": finish}
        if finish is not None:
            entry["stop_reason"] = choice.stop_reason
        return [entry]


def _merge_parts(parts: list[dict]) -> dict:
    delta: dict = {}
    for part in parts:
        if "content" in part:
            delta["content"] = delta.get("content", "") + part["content"]
        if "tool_calls" in part:
            delta.setdefault("tool_calls", []).extend(part["tool_calls"])
    return delta
